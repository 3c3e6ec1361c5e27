/*
 * Small hand-built profiles shared by the planner tests: a builder that
 * stops at the first error, and one_big(), a profile whose peak one swap
 * of a large activation can relieve when the stretches around it are long
 * enough.
 */
#ifndef CAP_TEST_POLICY_FIXTURES_H
#define CAP_TEST_POLICY_FIXTURES_H

#include <stdio.h>

#include "capuchin/profile.h"

#define MB (1000u * 1000u)
#define US 1000

/* Profile builder shorthand. */
typedef struct {
  cap_profile_t *p;
  uint32_t seq;
  int err;
} fx_t;

static void fx_tensor(fx_t *f, uint32_t id, uint64_t bytes, cap_tensor_kind_t k) {
  if (!f->err)
    f->err = cap_profile_add_tensor(f->p, id, bytes, k);
}

static void fx_op(fx_t *f, int64_t start, int64_t end, const char *name,
                  const uint32_t *in, uint32_t n_in, const uint32_t *out,
                  uint32_t n_out) {
  if (!f->err)
    f->err = cap_profile_add_op(f->p, f->seq++, start, end, name, in, n_in, out,
                                n_out);
}

static void fx_free(fx_t *f, int64_t t, uint32_t id) {
  if (!f->err)
    f->err = cap_profile_add_free(f->p, t, id);
}

static cap_profile_t *fx_finish(fx_t *f) {
  if (!f->err)
    f->err = cap_profile_finish(f->p);
  if (f->err) {
    fprintf(stderr, "fixture: %s\n", cap_profile_error(f->p));
    cap_profile_destroy(f->p);
    return NULL;
  }
  return f->p;
}

/* W (param, 1 MB) produces A (100 MB) at op 0 in op0_ns. Then n_pre ops,
 * then op B (80 MB) and n_mid ops reading it, then B dies and n_post ops
 * run, then the last op reads A again; every other op takes step_ns and
 * writes a 1 MB temporary that dies at once. The peak (A + B, 182 MB) is in
 * the middle stretch; the last op itself needs 102 MB. A swap-out holds its
 * memory until the copy ends and a swap-in from its start (2 ms or so for
 * 100 MB), so a swap relieves the middle only if the stretches around it
 * are long enough. */
static inline cap_profile_t *one_big(uint32_t n_pre, uint32_t n_mid,
                                     uint32_t n_post, int64_t step_ns,
                                     int64_t op0_ns) {
  fx_t f = {cap_profile_create(), 0, 0};
  uint32_t W = 0, A = 1, B = 2, next = 3;
  fx_tensor(&f, W, 1 * MB, CAP_KIND_PARAM);
  fx_tensor(&f, A, 100 * MB, CAP_KIND_ACTIVATION);
  fx_tensor(&f, B, 80 * MB, CAP_KIND_ACTIVATION);
  for (uint32_t i = 0; i < n_pre + n_mid + n_post + 1; i++)
    fx_tensor(&f, 3 + i, 1 * MB, CAP_KIND_ACTIVATION);
  int64_t t = 0;
  fx_op(&f, t, t + op0_ns, "aten.mm.default", &W, 1, &A, 1);
  t += op0_ns;
  for (uint32_t i = 0; i < n_pre + n_mid + n_post; i++) {
    if (i == n_pre) {
      fx_op(&f, t, t + 10 * US, "aten.mm.default", &W, 1, &B, 1);
      t += 10 * US;
    }
    uint32_t s = next++;
    fx_op(&f, t, t + step_ns, "aten.mul.Tensor", i >= n_pre && i < n_pre + n_mid ? &B : &W,
          1, &s, 1);
    t += step_ns;
    fx_free(&f, t, s);
    if (i + 1 == n_pre + n_mid)
      fx_free(&f, t, B);
  }
  uint32_t in[2] = {A, W}, last = next;
  fx_op(&f, t, t + 10 * US, "aten.mm_backward.default", in, 2, &last, 1);
  t += 10 * US;
  fx_free(&f, t, A);
  fx_free(&f, t, last);
  return fx_finish(&f);
}

#endif
