/* Shared between the files of cap_proto; not installed. */
#ifndef CAPUCHIN_PROTO_INTERNAL_H
#define CAPUCHIN_PROTO_INTERNAL_H

#include <stdarg.h>
#include <stddef.h>

#include "capuchin/frame.h"

/* Bytes a string field occupied on the wire, for the embedded-NUL check:
 * protobuf-c terminates a string at its wire length, so a NUL inside it would
 * silently shorten it. The decoder's allocator knows each allocation's size
 * (wire length + 1); strings of messages built locally have no such record
 * (the callback is NULL and only strlen() is known). */
typedef size_t (*cap__strlen_fn)(const char *s, void *ctx);

/* cap_frame_validate() with a wire-length callback (may be NULL). */
int cap__frame_validate(const Capuchin__Envelope *env,
                        const cap_frame_limits_t *lim, cap__strlen_fn wire_len,
                        void *ctx, char *err, size_t err_len);

/* Copy of *lim with every 0 replaced by its default (lim NULL: defaults). */
void cap__frame_limits_resolve(const cap_frame_limits_t *lim,
                               cap_frame_limits_t *out);

/* snprintf into err (when err_len > 0), then return code. */
int cap__proto_fail(char *err, size_t err_len, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#endif /* CAPUCHIN_PROTO_INTERNAL_H */
