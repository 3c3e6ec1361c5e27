/*
 * Placement under a framework's allocator (docs/placement.md, "Under
 * PyTorch"). In model 2 (capuchin/framework.h) the framework allocates;
 * here the framework's allocator itself is routed to the client (PyTorch:
 * a CUDAPluggableAllocator whose alloc and free call the two functions
 * below), so that the plan's placement can be carried out although the
 * client never allocates a tensor itself:
 *
 * - a guided iteration's allocation that the plan placed comes from the
 *   placement region at region base + the block's offset, with no search.
 *   An allocation made before the next op is reported (cap_client_op_run)
 *   whose size is that of the next tensor the op will adopt is taken to be
 *   that tensor (cap_client_adopt names it: the i-th transient tensor of an
 *   iteration gets the id the i-th of the first iteration got), so an op's
 *   n-th output allocation maps to that output's first-touch block; and the
 *   memory the client asks the framework for (its alloc callback: a
 *   swap-in, a recompute or a weight's return) is that restore's block;
 * - everything else (a size that differs, a kernel's workspace, what the
 *   framework allocates while the client calls it back, such as a
 *   recompute's replay, the measured iteration, passive mode, a plan whose
 *   arena found no room)
 *   comes from the client's budgeted allocator, in the room the placement
 *   leaves free, exactly as an allocation the plan did not place in model 1.
 *   The region never lets two live allocations overlap, so an allocation
 *   mapped to the wrong block is a counted miss, never shared bytes.
 *
 * Memory the framework holds from cap_client_framework_alloc is counted
 * once, from its alloc to its free: adopting it does not count it again.
 * An output never takes over an input's block here (placement's in-place
 * sharing): the framework allocates it while the op still reads the input.
 *
 * Same thread rules as the rest of the client (owner thread or serialised
 * with it: the PyTorch adapter holds the GIL). Neither function calls the
 * framework's callbacks except through waits for swap-outs in flight,
 * which release their memory (the release callback) as they finish.
 */
#ifndef CAPUCHIN_FRAMEWORK_ALLOC_H
#define CAPUCHIN_FRAMEWORK_ALLOC_H

#include "capuchin/framework.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Route placement through cap_client_framework_alloc (on) or leave the
 * framework's tensors unplaced (off, the default: a plan's placement is
 * then ignored, as model 2 does without this). Takes effect at the next
 * plan installed, i.e. at the next iteration boundary; call it before the
 * first iteration. CAP_EINVAL without framework memory callbacks. */
CAP_EXTERN int cap_client_set_framework_placement(cap_client_t *c, bool on);

/* `bytes` of device memory for the framework: at its planned block when the
 * plan places this allocation (above), else from the budgeted allocator,
 * waiting for swap-outs in flight while over the budget. 0 and *dev;
 * CAP_EBUDGET when even that leaves no room (the framework may take the
 * memory elsewhere; adopting it counts it as framework memory), CAP_ENOMEM.
 * Counts placed_allocs and placement_misses in the iteration's stats. */
CAP_EXTERN int cap_client_framework_alloc(cap_client_t *c, uint64_t bytes,
                                          void **dev);

/* Give back memory from cap_client_framework_alloc. CAP_ENOENT when dev is
 * not the client's (the framework took it elsewhere): nothing changes. */
CAP_EXTERN int cap_client_framework_free(cap_client_t *c, void *dev);

/* Allocations from cap_client_framework_alloc not yet given back: a client must
 * not be destroyed while the framework holds any (its arenas go with it). Any
 * thread. */
CAP_EXTERN uint64_t cap_client_framework_lent(cap_client_t *c);

#ifdef __cplusplus
}
#endif

#endif /* CAPUCHIN_FRAMEWORK_ALLOC_H */
