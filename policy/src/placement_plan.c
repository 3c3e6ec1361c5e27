/*
 * A plan's placement (placement.h): the simulator's residency intervals
 * become cap_interval_t, in-place sharing is offered where it is correct,
 * and cap_place assigns the offsets.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "capuchin/error.h"
#include "capuchin/placement.h"
#include "capuchin/types.h"

/* Elementwise ATen ops, forward and backward: the output element i reads
 * input element i only, so writing the output over the input is safe (the
 * in-place variants of these exist in PyTorch for that reason). */
static const char *const elementwise[] = {
    "relu",          "threshold_backward", "gelu",          "gelu_backward",
    "silu",          "silu_backward",      "sigmoid",       "sigmoid_backward",
    "tanh",          "tanh_backward",      "hardtanh",      "hardtanh_backward",
    "add",           "sub",                "mul",           "div",
    "neg",           "exp",                "clamp",         "leaky_relu",
    "leaky_relu_backward",
};

bool cap_op_may_share_input(const char *aten_name) {
  if (!aten_name)
    return false;
  const char *base = strncmp(aten_name, "aten.", 5) == 0 ? aten_name + 5 : aten_name;
  size_t len = strcspn(base, ".");
  for (size_t i = 0; i < sizeof elementwise / sizeof *elementwise; i++)
    if (strlen(elementwise[i]) == len && strncmp(base, elementwise[i], len) == 0)
      return true;
  return false;
}

static bool lists(const uint32_t *v, uint32_t n, uint32_t id) {
  for (uint32_t i = 0; i < n; i++)
    if (v[i] == id)
      return true;
  return false;
}

/* The interval of tensor x in force when interval y was allocated at the
 * op it is first touched by, if x may hand its block to y there. */
static uint32_t share_source(const cap_profile_t *p, const cap_residency_t *r,
                             const uint32_t *latest, uint32_t y) {
  const cap_residency_t *ry = &r[y];
  if (ry->kind != CAP_RESIDENCY_FIRST_TOUCH || ry->first_op >= p->n_ops)
    return CAP_NONE;
  const cap_op_t *o = &p->ops[ry->first_op];
  if (!cap_op_may_share_input(o->name))
    return CAP_NONE;
  const uint32_t *in = cap_op_inputs(p, o), *out = cap_op_outputs(p, o);
  for (uint32_t j = 0; j < o->n_in; j++) {
    uint32_t x = latest[in[j]];
    if (x == CAP_NONE || lists(out, o->n_out, in[j]))
      continue;
    const cap_residency_t *rx = &r[x];
    /* Its last use is this op and nothing reads it afterwards. */
    if (rx->last_op == ry->first_op && !rx->copied_out &&
        rx->bytes >= ry->bytes && rx->start_ns <= ry->start_ns)
      return x;
  }
  return CAP_NONE;
}

int cap_plan_place(const cap_profile_t *p, const cap_plan_t *plan,
                   const cap_bandwidth_t *bw, cap_place_strategy_t s,
                   cap_plan_placement_t *out) {
  if (!out)
    return CAP_EINVAL;
  *out = (cap_plan_placement_t){0};
  if (!p)
    return CAP_EINVAL;
  cap_sim_result_t sim;
  int rc = cap_sim_residency(p, plan, bw, &sim, &out->intervals, &out->n);
  if (rc)
    return rc;
  int64_t sim_iter_ns = sim.iter_ns;
  cap_sim_result_close(&sim);
  out->persistent_bytes = p->persistent_bytes;

  uint32_t n = out->n;
  cap_interval_t *iv = malloc((n ? n : 1) * sizeof *iv);
  uint32_t *latest = malloc((p->n_tensors ? p->n_tensors : 1) * sizeof *latest);
  if (!iv || !latest) {
    free(iv);
    free(latest);
    cap_plan_placement_close(out);
    return CAP_ENOMEM;
  }
  for (uint32_t t = 0; t < p->n_tensors; t++)
    latest[t] = CAP_NONE;
  /* Intervals come in allocation order, so `latest` holds each tensor's
   * interval in force when interval i is made. */
  uint64_t evicted_persistent = 0;
  for (uint32_t i = 0; i < n; i++) {
    const cap_residency_t *r = &out->intervals[i];
    int64_t end = r->end_ns > r->start_ns ? r->end_ns : r->start_ns + 1;
    iv[i] = (cap_interval_t){.start = r->start_ns, .end = end,
                             .bytes = r->bytes,
                             .share = share_source(p, out->intervals, latest, i),
                             .same_as = CAP_NONE};
    if (r->kind == CAP_RESIDENCY_PERSISTENT)
      evicted_persistent += r->bytes;
    latest[r->tensor] = i;
  }
  /* A persistent tensor the plan evicts leaves the persistent region for
   * the arena: back on the device at the end, it must be where the next
   * iteration starts with it, at its first interval's offset. */
  for (uint32_t i = 0; i < n; i++) {
    const cap_residency_t *r = &out->intervals[i];
    uint32_t last = latest[r->tensor];
    if (r->kind == CAP_RESIDENCY_PERSISTENT && last != i &&
        out->intervals[last].end_ns >= sim_iter_ns) {
      iv[i].same_as = last;
      iv[last].same_as = i;
      iv[last].share = CAP_NONE;
    }
  }
  out->persistent_bytes -= evicted_persistent;
  rc = cap_place(iv, n, s, 0, &out->placement);
  out->blocks = iv;
  free(latest);
  if (rc)
    cap_plan_placement_close(out);
  return rc;
}

int cap_plan_attach_placement(cap_plan_t *plan, const cap_plan_placement_t *pp) {
  if (!plan || !pp || (pp->n && (!pp->blocks || !pp->placement.offsets)))
    return CAP_EINVAL;
  cap_block_t *b = malloc((pp->n ? pp->n : 1) * sizeof *b);
  if (!b)
    return CAP_ENOMEM;
  for (uint32_t i = 0; i < pp->n; i++) {
    const cap_residency_t *r = &pp->intervals[i];
    b[i] = (cap_block_t){.tensor = r->tensor, .kind = r->kind,
                         .action = r->action,
                         .offset = pp->placement.offsets[i], .bytes = r->bytes,
                         .start_ns = pp->blocks[i].start,
                         .end_ns = pp->blocks[i].end,
                         .share = pp->blocks[i].share,
                         .same_as = pp->blocks[i].same_as};
  }
  /* A share not taken is no share: the check would let the pair overlap. */
  for (uint32_t i = 0; i < pp->n; i++)
    if (b[i].share != CAP_NONE && b[i].offset != b[b[i].share].offset)
      b[i].share = CAP_NONE;
  int rc = cap_plan_set_blocks(plan, b, pp->n, pp->placement.arena_bytes);
  free(b);
  return rc;
}

uint64_t cap_plan_outside_arena(const cap_plan_t *plan, const cap_profile_t *p) {
  uint64_t outside = p->persistent_bytes;
  for (uint32_t i = 0; i < plan->n_blocks; i++)
    if (plan->blocks[i].kind == CAP_RESIDENCY_PERSISTENT)
      outside -= plan->blocks[i].bytes < outside ? plan->blocks[i].bytes : outside;
  return outside;
}

int cap_plan_check_blocks(const cap_plan_t *plan, char *err, size_t err_len) {
  if (err && err_len)
    err[0] = '\0';
  if (!plan)
    return CAP_EINVAL;
  uint32_t n = plan->n_blocks;
  const cap_block_t *b = plan->blocks;
  for (uint32_t i = 0; i < n; i++) {
    if (b[i].offset + b[i].bytes > plan->arena_bytes ||
        b[i].offset + b[i].bytes < b[i].offset || !b[i].bytes) {
      if (err)
        snprintf(err, err_len, "block %u (tensor %u) at %llu+%llu lies outside "
                 "the arena of %llu bytes", i, b[i].tensor,
                 (unsigned long long)b[i].offset, (unsigned long long)b[i].bytes,
                 (unsigned long long)plan->arena_bytes);
      return CAP_EINVAL;
    }
    if ((b[i].share != CAP_NONE && b[i].share >= n) ||
        (b[i].same_as != CAP_NONE && b[i].same_as >= n)) {
      if (err)
        snprintf(err, err_len, "block %u (tensor %u) names block %u, of %u",
                 i, b[i].tensor,
                 b[i].share != CAP_NONE && b[i].share >= n ? b[i].share
                                                           : b[i].same_as, n);
      return CAP_EINVAL;
    }
  }
  cap_interval_t *iv = malloc((n ? n : 1) * sizeof *iv);
  uint64_t *off = malloc((n ? n : 1) * sizeof *off);
  if (!iv || !off) {
    free(iv);
    free(off);
    return CAP_ENOMEM;
  }
  for (uint32_t i = 0; i < n; i++) {
    iv[i] = (cap_interval_t){.start = b[i].start_ns, .end = b[i].end_ns,
                             .bytes = b[i].bytes, .share = b[i].share,
                             .same_as = b[i].same_as};
    off[i] = b[i].offset;
  }
  uint32_t x = 0, y = 0;
  /* Offsets are checked as placed: with the bytes the plan states (the
   * arena's alignment is already in the offsets). */
  int rc = cap_placement_check(iv, n, off, 1, &x, &y);
  if (rc == CAP_EINVAL && err) {
    int64_t from = b[x].start_ns > b[y].start_ns ? b[x].start_ns : b[y].start_ns;
    int64_t to = b[x].end_ns < b[y].end_ns ? b[x].end_ns : b[y].end_ns;
    if (b[x].same_as == y)
      snprintf(err, err_len, "blocks %u and %u of tensor %u cross the "
               "iteration's boundary at different offsets (%llu, %llu)",
               x, y, b[x].tensor, (unsigned long long)b[x].offset,
               (unsigned long long)b[y].offset);
    else
      snprintf(err, err_len, "tensor %u (block %u, %llu+%llu) and tensor %u "
               "(block %u, %llu+%llu) collide from %lld to %lld ns",
               b[x].tensor, x, (unsigned long long)b[x].offset,
               (unsigned long long)b[x].bytes, b[y].tensor, y,
               (unsigned long long)b[y].offset, (unsigned long long)b[y].bytes,
               (long long)from, (long long)to);
  } else if (rc && err) {
    snprintf(err, err_len, "blocks are not a placement: %s", cap_strerror(rc));
  }
  free(iv);
  free(off);
  return rc;
}

static bool same_key(const cap_block_t *b, const cap_residency_t *r) {
  return b->tensor == r->tensor && b->kind == r->kind && b->action == r->action;
}

int cap_plan_check_placement(const cap_plan_t *plan, const cap_profile_t *p,
                             const cap_bandwidth_t *bw, char *err,
                             size_t err_len) {
  if (err && err_len)
    err[0] = '\0';
  if (!plan || !p || !bw)
    return CAP_EINVAL;
  if (!plan->n_blocks)
    return 0;
  cap_sim_result_t sim;
  cap_residency_t *res = NULL;
  uint32_t n = 0;
  int rc = cap_sim_residency(p, plan, bw, &sim, &res, &n);
  if (rc)
    return rc;
  cap_sim_result_close(&sim);
  /* Keys are unique within an iteration (a first touch per tensor, a
   * swap-in or recompute per action, a temporary per tensor and list), and
   * blocks come in the simulator's order: one forward scan, with a search
   * when the orders differ. */
  uint32_t j = 0;
  for (uint32_t i = 0; i < n && !rc; i++) {
    const cap_residency_t *r = &res[i];
    if (j >= plan->n_blocks || !same_key(&plan->blocks[j], r))
      for (j = 0; j < plan->n_blocks && !same_key(&plan->blocks[j], r); j++)
        ;
    int64_t end = r->end_ns > r->start_ns ? r->end_ns : r->start_ns + 1;
    if (j == plan->n_blocks) {
      if (err)
        snprintf(err, err_len, "tensor %u (%s, action %d) is on the device "
                 "from %lld to %lld ns and has no block", r->tensor,
                 cap_residency_kind_name(r->kind),
                 r->action == CAP_NONE ? -1 : (int)r->action,
                 (long long)r->start_ns, (long long)end);
      rc = CAP_EINVAL;
    } else if (plan->blocks[j].start_ns > r->start_ns ||
               plan->blocks[j].end_ns < end) {
      if (err)
        snprintf(err, err_len, "tensor %u (%s) is on the device from %lld to "
                 "%lld ns, outside its block's %lld to %lld", r->tensor,
                 cap_residency_kind_name(r->kind), (long long)r->start_ns,
                 (long long)end, (long long)plan->blocks[j].start_ns,
                 (long long)plan->blocks[j].end_ns);
      rc = CAP_EINVAL;
    }
    j++;
  }
  free(res);
  return rc ? rc : cap_plan_check_blocks(plan, err, err_len);
}

void cap_plan_placement_close(cap_plan_placement_t *pp) {
  if (!pp)
    return;
  free(pp->intervals);
  free(pp->blocks);
  cap_placement_close(&pp->placement);
  *pp = (cap_plan_placement_t){0};
}
