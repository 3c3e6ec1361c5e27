/*
 * Model signature: 64-bit FNV-1a over what identifies a model and batch
 * independently of one run's timing: tensor sizes and kinds in id order,
 * then each op's name and input and output lists. Times, frees (ordered by
 * time) and meta (device, framework versions) are left out, so two runs of
 * the same model and batch get the same signature.
 */
#include <string.h>

#include "capuchin/profile.h"

#define FNV_OFFSET UINT64_C(0xcbf29ce484222325)
#define FNV_PRIME UINT64_C(0x100000001b3)

static uint64_t mix_bytes(uint64_t h, const void *data, size_t n) {
  const unsigned char *b = data;
  for (size_t i = 0; i < n; i++) {
    h ^= b[i];
    h *= FNV_PRIME;
  }
  return h;
}

/* Little-endian byte order whatever the host, so stored signatures match
 * across machines. */
static uint64_t mix_u64(uint64_t h, uint64_t v) {
  unsigned char b[8];
  for (int i = 0; i < 8; i++)
    b[i] = (unsigned char)(v >> (8 * i));
  return mix_bytes(h, b, sizeof b);
}

uint64_t cap_profile_signature(const cap_profile_t *p) {
  uint64_t h = FNV_OFFSET;
  if (!p)
    return h;
  h = mix_u64(h, p->n_tensors);
  for (uint32_t t = 0; t < p->n_tensors; t++) {
    h = mix_u64(h, p->tensors[t].bytes);
    h = mix_u64(h, (uint64_t)p->tensors[t].kind);
  }
  h = mix_u64(h, p->n_ops);
  for (uint32_t o = 0; o < p->n_ops; o++) {
    const cap_op_t *op = &p->ops[o];
    /* The terminating NUL keeps "ab"+"c" apart from "a"+"bc". */
    h = mix_bytes(h, op->name, strlen(op->name) + 1);
    h = mix_u64(h, op->n_in);
    for (uint32_t i = 0; i < op->n_in; i++)
      h = mix_u64(h, p->op_tensors[op->in_off + i]);
    h = mix_u64(h, op->n_out);
    for (uint32_t i = 0; i < op->n_out; i++)
      h = mix_u64(h, p->op_tensors[op->out_off + i]);
  }
  return h;
}
