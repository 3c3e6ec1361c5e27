/*
 * Fault injection for the client (SQLite's faultsim, libuv's test-loop-oom):
 * tests arm a fault point to fail its N-th call from now, optionally for
 * several calls in a row, and the code under test takes its error path.
 *
 * Points are process-wide (tests run one per process) and thread-safe; an
 * unarmed point costs one relaxed atomic load.
 */
#ifndef CAP_CLIENT_FAULTSIM_H
#define CAP_CLIENT_FAULTSIM_H

#include <stdbool.h>
#include <stdint.h>

typedef enum {
  CAP_FAULT_DEVICE_ALLOC = 0, /* cap_backend_device_alloc -> CAP_ENOMEM */
  CAP_FAULT_HOST_ALLOC,       /* cap_backend_host_alloc -> CAP_ENOMEM */
  CAP_FAULT_COPY_SUBMIT,      /* cap_backend_copy_async -> CAP_EDEVICE,
                                 nothing queued */
  CAP_FAULT_COPY_ASYNC,       /* cap_backend_copy_async returns 0 but the
                                 copy fails: bytes not moved, the next event
                                 recorded on its stream reports CAP_EDEVICE */
  CAP_FAULT_EVENT,            /* cap_backend_event_create/record ->
                                 CAP_EDEVICE */
  CAP_FAULT_BFC_ARENA,        /* the BFC allocator's arena request fails
                                 with CAP_ENOMEM before reaching its source */
  CAP_FAULT_CLIENT_ALLOC,     /* free for the client's own use */
  CAP_FAULT_COUNT
} cap_fault_t;

/* Arm `point`: the call `countdown` calls from now fails (1 = the next one),
 * and so do the `repeat` - 1 calls after it (repeat 0 is taken as 1; a
 * negative repeat fails every call from then on). countdown 0 disarms. */
void cap_faultsim_arm(cap_fault_t point, int64_t countdown, int64_t repeat);

/* Disarm every point and zero the counters. */
void cap_faultsim_reset(void);

/* Called at a fault point: true if this call must fail. Counts hits. */
bool cap_faultsim_step(cap_fault_t point);

/* Failures injected at `point` since the last reset. */
uint64_t cap_faultsim_injected(cap_fault_t point);

#endif /* CAP_CLIENT_FAULTSIM_H */
