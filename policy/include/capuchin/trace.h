/*
 * Reader and writer for `capuchin-trace 1` files (tests/data/traces/FORMAT.md).
 *
 * The reader is strict: any deviation from the format fails with a message
 * naming the file, the line and the reason
 * ("resnet50.trace:1042: op 17: unknown tensor id 99999"). It never crashes,
 * leaks or reads out of bounds, whatever the input.
 *
 * Accepted: lines of printable ASCII ending in '\n' (the last one may lack
 * it), fields separated by exactly one space, records in the order header,
 * meta, tensor, op, free. Rejected with the line: empty lines, CR, NUL, tabs
 * and any other byte outside 0x20-0x7e, numbers that are not plain decimal
 * or overflow, ids of 2^31 or more, and whatever the profile builder
 * refuses (profile.h). Errors that only the whole file shows (no ops,
 * iter_ns before the last op's end) name the last line.
 */
#ifndef CAPUCHIN_TRACE_H
#define CAPUCHIN_TRACE_H

#include <stddef.h>
#include <stdio.h>

#include "capuchin/profile.h"

/* Parse a whole trace held in memory. `name` is used in messages only.
 * On success *out is a finished profile the caller destroys. On failure
 * returns a CAP_E* code, *out is NULL and err (if non-NULL) holds a message,
 * truncated to err_len. */
int cap_trace_parse(const char *buf, size_t len, const char *name,
                    cap_profile_t **out, char *err, size_t err_len);

/* Read and parse a file. Messages name the file's base name. */
int cap_trace_load(const char *path, cap_profile_t **out, char *err,
                   size_t err_len);

/* Write a finished profile as a `capuchin-trace 1` file that
 * cap_trace_parse() reads back into an equal profile. */
int cap_trace_write(FILE *f, const cap_profile_t *p);

#endif /* CAPUCHIN_TRACE_H */
