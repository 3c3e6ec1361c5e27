/*
 * A synthetic training iteration of any length, for planner tests and
 * benchmarks: a transformer-like chain of layers (forward: matmul-like op
 * reading the previous activation and the layer's weight, every third layer
 * an in-place activation; a loss; backward in reverse order reading the
 * saved activation, the weight and the incoming gradient; an optimizer
 * step). Op durations and tensor sizes vary by layer so that no two
 * candidates tie. Deterministic for a given n_ops.
 */
#ifndef CAP_SYNTH_PROFILE_H
#define CAP_SYNTH_PROFILE_H

#include <stdint.h>
#include <stdlib.h>

#include "capuchin/profile.h"

/* Builds a finished profile with about n_ops ops (n_ops >= 8), or NULL. */
static inline cap_profile_t *cap_synth_profile(uint32_t n_ops) {
  uint32_t L = (n_ops - 2) / 2;           /* layers */
  uint32_t n_inplace = 0;
  for (uint32_t i = 0; i < L; i++)
    n_inplace += i % 3 == 2;
  while (L > 1 && 2 * L + 2 + n_inplace > n_ops) {
    L--;
    n_inplace -= (L % 3 == 2);
  }
  cap_profile_t *p = cap_profile_create();
  if (!p)
    return NULL;
  /* ids: 0 input, 1..L weights, L+1..2L activations A_i, 2L+1..3L+1
   * gradients G_0..G_L */
  uint32_t in_id = 0, w0 = 1, a0 = L + 1, g0 = 2 * L + 1;
  int rc = cap_profile_add_tensor(p, in_id, 4u << 20, CAP_KIND_INPUT);
  for (uint32_t i = 0; i < L && !rc; i++)
    rc = cap_profile_add_tensor(p, w0 + i, (1u << 20) + 4096u * (i % 13),
                                CAP_KIND_PARAM);
  for (uint32_t i = 0; i < L && !rc; i++)
    rc = cap_profile_add_tensor(p, a0 + i,
                                (8u << 20) + (uint64_t)(i % 11) * (512u << 10),
                                CAP_KIND_ACTIVATION);
  for (uint32_t i = 0; i <= L && !rc; i++)
    rc = cap_profile_add_tensor(p, g0 + i, 8u << 20, CAP_KIND_ACTIVATION);
  int64_t t = 0;
  uint32_t seq = 0;
  char name_fwd[] = "aten.mm.default", name_relu[] = "aten.relu_.default",
       name_loss[] = "aten.nll_loss.default", name_bwd[] = "aten.mm_backward.default",
       name_opt[] = "aten._foreach_add_.List";
  for (uint32_t i = 0; i < L && !rc; i++) {
    uint32_t ins[2] = {i ? a0 + i - 1 : in_id, w0 + i}, out = a0 + i;
    int64_t d = 20000 + 3000 * (int64_t)(i % 7);
    rc = cap_profile_add_op(p, seq++, t, t + d, name_fwd, ins, 2, &out, 1);
    t += d + 1000;
    if (!rc && i % 3 == 2) {
      rc = cap_profile_add_op(p, seq++, t, t + 4000, name_relu, &out, 1, &out, 1);
      t += 5000;
    }
  }
  if (!rc) {
    uint32_t x = a0 + L - 1, g = g0 + L;
    rc = cap_profile_add_op(p, seq++, t, t + 10000, name_loss, &x, 1, &g, 1);
    t += 11000;
  }
  for (uint32_t i = L; i-- > 0 && !rc;) {
    uint32_t ins[3] = {g0 + i + 1, a0 + i, w0 + i}, out = g0 + i;
    int64_t d = 40000 + 5000 * (int64_t)(i % 5);
    rc = cap_profile_add_op(p, seq++, t, t + d, name_bwd, ins, 3, &out, 1);
    t += d;
    if (!rc)
      rc = cap_profile_add_free(p, t, a0 + i);
    if (!rc)
      rc = cap_profile_add_free(p, t, g0 + i + 1);
    t += 1000;
  }
  if (!rc) {
    uint32_t *ins = malloc(((size_t)L + 1) * sizeof *ins);
    if (!ins)
      rc = -1;
    for (uint32_t i = 0; i < L && !rc; i++)
      ins[i] = w0 + i;
    if (!rc) {
      ins[L] = g0;
      rc = cap_profile_add_op(p, seq++, t, t + 30000, name_opt, ins, L + 1, ins,
                              L);
      if (!rc)
        rc = cap_profile_add_free(p, t + 30000, g0);
    }
    free(ins);
  }
  if (!rc)
    rc = cap_profile_finish(p);
  if (rc) {
    cap_profile_destroy(p);
    return NULL;
  }
  return p;
}

#endif /* CAP_SYNTH_PROFILE_H */
