/*
 * Framework-owned device memory (DESIGN.md, "Two ways a framework holds
 * memory", model 2): the framework (PyTorch's caching allocator) allocates
 * and frees tensor memory; the client only copies out of and into the
 * pointers it is handed, on its own D2H and H2D streams, and says when it
 * is done with them.
 *
 * The framework adopts each tensor it wants managed: it hands the client
 * the tensor's device pointer and size (cap_client_adopt, or
 * cap_client_adopt_persistent for weights and optimizer state) and reports
 * ops with cap_client_op_begin/op_end exactly as in model 1. The executor
 * is the same: the plan's triggers fire at the same accesses, on the same
 * streams, with the same stall measurement and feedback. What differs is
 * only who owns the bytes:
 *
 * - Eviction (after the evicted-access's op end). Swap: the client starts
 *   the D2H copy out of the framework's pointer; when the copy's event has
 *   completed it calls release(id, dev): from then on the client no longer
 *   reads dev and the framework may free or reuse it. Recompute: release is
 *   called at once. Until release the framework must keep the memory alive
 *   (PyTorch: hold a reference to the storage).
 * - Bringing back (in-trigger prefetch, back-access, recompute): the client
 *   asks the framework for memory with alloc(id, bytes, &dev), then copies
 *   into it on the H2D stream (or has the recompute callback fill it). The
 *   tensor's new address is what op begin's pointers, cap_client_acquire
 *   and cap_client_tensor_ptr return; it is ready in compute-stream order
 *   (cuda: the compute stream waits on the copy's event; sim: a host wait).
 *
 * Both callbacks run on the owner thread, from within the calls that move
 * tensors or finish copies (op begin/end and op_run, cap_client_acquire,
 * cap_client_make_room, cap_client_poll, iteration begin/end, free and
 * destroy); they must not call back into the client except
 * cap_client_tensor_ptr. release may name an id the framework has freed
 * since (a copy out of it was still running): the address is what counts.
 * Budget: the client counts the bytes of adopted tensors that are on the
 * device as in use; a prefetch that would exceed the budget waits until
 * the back-access (then the framework's allocation waits for swap-outs in
 * flight, and is not refused).
 */
#ifndef CAPUCHIN_FRAMEWORK_H
#define CAPUCHIN_FRAMEWORK_H

#include "capuchin/client.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Allocate `bytes` of device memory for adopted tensor id: 0 and *dev, or
 * a negative value when the framework cannot (the client then keeps the
 * tensor's host copy and tries again at its access, which fails if the
 * framework still refuses). */
typedef int (*cap_framework_alloc_fn)(void *user, uint32_t id, uint64_t bytes,
                                      void **dev);
/* The client no longer uses dev, the device memory of tensor id that it
 * evicted (or that it had allocated for a copy or a recompute that was
 * abandoned): the framework may free it. */
typedef void (*cap_framework_release_fn)(void *user, uint32_t id, void *dev,
                                         uint64_t bytes);

/* Register the framework's memory callbacks (both required). Call before
 * adopting tensors; config.framework_memory should be set at create so
 * that the client takes no device arena of its own. */
CAP_EXTERN int cap_client_set_framework_memory(cap_client_t *c,
                                               cap_framework_alloc_fn alloc,
                                               cap_framework_release_fn release,
                                               void *user);

/* Declare a transient tensor whose `bytes` of device memory the framework
 * holds at dev (it is on the device now). Ids follow cap_client_declare's
 * rule: the i-th transient tensor of an iteration gets the id the i-th of
 * the first iteration got. Inside an iteration, outside an op. */
CAP_EXTERN int cap_client_adopt(cap_client_t *c, uint64_t bytes, void *dev,
                                uint32_t *id);

/* Register a persistent tensor (kind CAP_KIND_PARAM or CAP_KIND_INPUT) the
 * framework holds at dev. Plans that evict persistent tensors are not
 * carried out on an adopted one unless the framework said it can give up
 * its memory (cap_client_set_evictable): such an action keeps the tensor
 * and counts as a fallback. */
CAP_EXTERN int cap_client_adopt_persistent(cap_client_t *c, uint64_t bytes,
                                           cap_tensor_kind_t kind, void *dev,
                                           uint32_t *id);

/* Whether the framework can give up the memory of persistent tensor id
 * (adopted) after its evicted-access and take new memory for it when the
 * client brings it back (PyTorch: resize the storage to 0 bytes and back;
 * the tensor objects on it stay; not a storage NumPy shares), through the
 * same release and alloc callbacks as a transient tensor's. Plans that
 * evict it are then carried out. Since anything may read a weight, the
 * framework must bring it back (cap_client_acquire) before it runs an op
 * that reads or writes it, and before its own code reads it outside ops
 * (between iterations). Off for each tensor until set; CAP_EINVAL for a
 * tensor that is not an adopted persistent one. */
CAP_EXTERN int cap_client_set_evictable(cap_client_t *c, uint32_t id, bool yes);

/* Bring tensor id back to the device now, outside an op, and give its
 * address: what a saved-tensor unpack hook calls just before the
 * back-access op is dispatched. Swapped out: its copy in (started by the
 * prefetch, else now) is waited for in compute-stream order; dropped: it
 * is recomputed through the recompute callback. Not an access (the op that
 * follows is). Returns CAP_ERECOMPUTE / CAP_EDEVICE / CAP_EBUDGET when the
 * data cannot be brought back (never stale data). */
CAP_EXTERN int cap_client_acquire(cap_client_t *c, uint32_t id, void **dev);

/* Report an op the framework has already run: PyTorch's dispatcher creates
 * an op's outputs only as the op runs, so they can be adopted only after
 * it. This is op begin (the access record; every tensor listed is brought
 * to the device first, which for tensors the framework holds is a no-op)
 * and op end (the plan's evictions after this access), with the op's
 * start taken as duration_ns before now. Returns as op begin does. */
CAP_EXTERN int cap_client_op_run(cap_client_t *c, const char *name,
                                 const uint32_t *in, uint32_t n_in,
                                 const uint32_t *out, uint32_t n_out,
                                 int64_t duration_ns);

/* How a measured iteration's ops reported by cap_client_op_run are laid on
 * its recorded timeline. Off (the default): on the host's clock, the time
 * between two ops included. On: on the device's, for a framework whose ops
 * run asynchronously on a GPU and that measures each op's time there
 * (synchronising around it) for duration_ns: each op starts where the op
 * before it ended, and the host's time between ops (the framework's own
 * work, the measuring) is left out of the timeline, as the client's host
 * waits are; a tensor freed between two ops is freed at the first one's
 * end. A GPU job's host runs ahead of its device, so its device's timeline
 * is the one copies overlap. CAP_EINVAL without a client. */
CAP_EXTERN int cap_client_set_device_timeline(cap_client_t *c, bool on);

/* The framework found that this iteration no longer follows the one the
 * plan was made for (other shapes, other ops): the plan stops for the rest
 * of the iteration (no more evictions or prefetches; what is already out
 * comes back on demand, as cap_client_acquire brings it) and the iteration
 * ends passive. The plan is kept for the next iteration. */
CAP_EXTERN int cap_client_diverged(cap_client_t *c);

/* The framework is about to run the next op, which allocates its outputs
 * before the op can be reported: in a guided iteration, while the bytes in
 * use plus what that op's outputs took in the last complete iteration
 * exceed the budget, wait for the swap-outs in flight to finish, oldest
 * first, and release their memory (each wait is a budget wait and counts
 * as stall time, as when the client allocates in model 1). Outside guided
 * iterations it only waits while the bytes in use exceed the budget.
 * Returns 1 when the op's outputs fit, 0 when they do not and no swap-out
 * is left to wait for. An access that brings a tensor back outside the
 * plan (cap_client_acquire, a recompute) makes room the same way before
 * asking the framework for memory. */
CAP_EXTERN int cap_client_make_room(cap_client_t *c);

/* Whether a recompute list of the plan in force may replay op seq (0-based,
 * in reporting order) of this guided iteration, through the recompute
 * callback: a framework that must keep an op's arguments to replay it
 * keeps only those ops'. false outside guided iterations. Any thread that
 * owns the client; O(1). */
CAP_EXTERN bool cap_client_op_replayed(cap_client_t *c, uint32_t seq);

/* The mode of the iteration in progress (the last one between iterations):
 * a framework that times ops more carefully while they are measured. */
CAP_EXTERN cap_mode_t cap_client_mode(cap_client_t *c);

/* Collect the copies that have finished (calling release for the device
 * memory swap-outs no longer read), and start the prefetches that waited
 * for the H2D copy engine (the plan takes a tensor's memory when its copy
 * starts, and copies in run one at a time). Returns the number of
 * swap-outs still running.
 * Op end and iteration begin/end do this too. */
CAP_EXTERN int cap_client_poll(cap_client_t *c);

/* Whether the client still holds the framework memory at dev for a copy
 * it started: a swap-out out of it, or a copy into the memory of a tensor
 * freed meanwhile. It calls release for dev once that copy is done; until
 * then the framework must keep the memory even when nothing else of it
 * does (a saved tensor autograd let go of, a freed tensor's buffer).
 * Memory no copy uses can go at once. Owner thread; O(copies in flight). */
CAP_EXTERN bool cap_client_copying(cap_client_t *c, const void *dev);

/* Whether tensor id is on the device now (1), not (0), or not live
 * (CAP_EINVAL): for adapters that want to know whether the memory they
 * handed over is theirs again. */
CAP_EXTERN int cap_client_tensor_resident(cap_client_t *c, uint32_t id);

#ifdef __cplusplus
}
#endif

#endif /* CAPUCHIN_FRAMEWORK_H */
