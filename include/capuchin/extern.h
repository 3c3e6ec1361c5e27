/*
 * CAP_EXTERN marks the functions libcapuchin-client exports (libuv's
 * UV_EXTERN). Every library is compiled with -fvisibility=hidden, so a
 * function without it stays inside the shared object even when other files
 * of the library call it: a training process that loads its own protobuf,
 * or another copy of the policy code, cannot bind to ours by accident.
 */
#ifndef CAPUCHIN_EXTERN_H
#define CAPUCHIN_EXTERN_H

#if defined(__GNUC__) || defined(__clang__)
#define CAP_EXTERN __attribute__((visibility("default")))
#else
#define CAP_EXTERN
#endif

#endif /* CAPUCHIN_EXTERN_H */
