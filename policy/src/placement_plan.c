/*
 * A plan's placement (placement.h): the simulator's residency intervals
 * become cap_interval_t, in-place sharing is offered where it is correct,
 * and cap_place assigns the offsets.
 */
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

void cap_plan_placement_close(cap_plan_placement_t *pp) {
  if (!pp)
    return;
  free(pp->intervals);
  free(pp->blocks);
  cap_placement_close(&pp->placement);
  *pp = (cap_plan_placement_t){0};
}
