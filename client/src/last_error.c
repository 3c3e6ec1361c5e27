/*
 * The client's last error message (cap_client_last_error): every part of
 * the client writes it, so it depends on nothing else.
 */
#include <stdarg.h>
#include <stdio.h>

#include "client_impl.h"

void cap__set_error(cap_client_t *c, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(c->err, sizeof c->err, fmt, ap);
  va_end(ap);
}
