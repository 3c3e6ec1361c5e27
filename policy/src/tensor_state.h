/*
 * Where a tensor's bytes are at a moment of the iteration, as the simulator
 * (sim.c) and the plan walk (plan_walk.c) follow a plan through it. The walk
 * does not model copy time: a swap-out takes the tensor straight to HOST,
 * and SWAP_IN means that its prefetch is issued (on the device once the
 * copy lands).
 */
#ifndef CAP_POLICY_TENSOR_STATE_H
#define CAP_POLICY_TENSOR_STATE_H

typedef enum {
  CAP__TS_UNBORN = 0, /* an activation before its first access */
  CAP__TS_RESIDENT,   /* on the device */
  CAP__TS_SWAP_OUT,   /* on the device, D2H in flight or queued (sim only) */
  CAP__TS_HOST,       /* evicted by swap: only the host copy exists */
  CAP__TS_SWAP_IN,    /* H2D started: device memory held, data arriving */
  CAP__TS_DROPPED,    /* evicted by recompute */
  CAP__TS_RELEASED,   /* released after its last access: no data left */
  CAP__TS_FREED,      /* the framework freed it */
} cap__tstate_t;

#endif /* CAP_POLICY_TENSOR_STATE_H */
