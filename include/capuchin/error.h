/*
 * Capuchin error codes, shared by every module and part of the client's
 * public API (installed with capuchin/client.h).
 *
 * Functions that act return int: 0 on success or a negative CAP_E* code.
 * One table (the X-macro below, as libuv's UV_ERRNO_MAP) gives each code its
 * message; cap_strerror() and cap_err_name() read it.
 */
#ifndef CAPUCHIN_ERROR_H
#define CAPUCHIN_ERROR_H

#include "capuchin/extern.h"

#define CAP_ERRNO_MAP(XX)                                                      \
  XX(EINVAL, -1, "invalid argument")                                           \
  XX(ENOMEM, -2, "out of memory")                                              \
  XX(EPARSE, -3, "malformed input")                                            \
  XX(ERANGE, -4, "value out of range")                                         \
  XX(EIO, -5, "input/output error")                                            \
  XX(EPROTO, -6, "protocol error")                                             \
  XX(E2BIG, -7, "frame larger than the allowed maximum")                       \
  XX(EAGAIN, -8, "incomplete, more data needed")                               \
  XX(ENOENT, -9, "not found")                                                  \
  XX(EINFEASIBLE, -10, "no plan fits the memory budget")                       \
  XX(EDEVICE, -11, "device error")                                             \
  XX(ENOTCONN, -12, "not connected to the daemon")                             \
  XX(ETIMEDOUT, -13, "timed out")                                              \
  XX(EBUDGET, -14, "over the memory budget")                                   \
  XX(ESTATE, -15, "operation not valid in this state")                         \
  XX(ECORRUPT, -16, "data integrity check failed")                             \
  XX(ESTORE, -17, "database error")                                            \
  XX(ERECOMPUTE, -18, "recompute callback failed")                             \
  XX(EPERM, -19, "permission denied")                                          \
  XX(EQUOTA, -20, "session quota exceeded")                                    \
  XX(EVERSION, -21, "unsupported version")                                     \
  XX(EUNSUPPORTED, -22, "not supported by this build or device")

enum {
#define CAP__ERR_ENUM(name, code, msg) CAP_##name = (code),
  CAP_ERRNO_MAP(CAP__ERR_ENUM)
#undef CAP__ERR_ENUM
};

/* Message for a CAP_E* code (or "unknown error"); never NULL. Thread-safe. */
CAP_EXTERN const char *cap_strerror(int err);

/* Symbolic name of a CAP_E* code ("CAP_EINVAL"), or "CAP_EUNKNOWN". */
CAP_EXTERN const char *cap_err_name(int err);

#endif /* CAPUCHIN_ERROR_H */
