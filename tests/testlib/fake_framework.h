/*
 * A fake framework for the client's framework-owned memory model
 * (capuchin/framework.h): device memory is malloc'd host memory, and the
 * framework remembers which buffers it still holds so that a test can say
 * how many live and free what is left. fake_fw_alloc and fake_fw_release
 * are the cap_framework_ops_t callbacks, their user pointer a fake_fw_t.
 */
#ifndef CAP_FAKE_FRAMEWORK_H
#define CAP_FAKE_FRAMEWORK_H

#include <stdint.h>
#include <stdlib.h>

#define FAKE_FW_MAX 64

typedef struct fake_fw {
  void *live[FAKE_FW_MAX];
  uint32_t n_live;
  uint32_t allocs, releases, recomputes;
  uint32_t released_ids[FAKE_FW_MAX]; /* the tensors the client let go of */
  uint32_t n_released_ids;
} fake_fw_t;

/* A new buffer the framework holds (an op's output, a weight). */
static inline void *fake_fw_new(fake_fw_t *f, size_t n) {
  void *p = malloc(n);
  if (p && f->n_live < FAKE_FW_MAX)
    f->live[f->n_live++] = p;
  return p;
}

/* The framework drops its last reference to p. */
static inline void fake_fw_drop(fake_fw_t *f, void *p) {
  for (uint32_t i = 0; i < f->n_live; i++)
    if (f->live[i] == p) {
      f->live[i] = f->live[--f->n_live];
      free(p);
      return;
    }
}

/* The client asks for memory to bring a tensor back into. */
static inline int fake_fw_alloc(void *user, uint32_t id, uint64_t bytes,
                                void **dev) {
  fake_fw_t *f = user;
  (void)id;
  f->allocs++;
  *dev = fake_fw_new(f, bytes);
  return *dev ? 0 : -1;
}

/* The client gave up an evicted tensor's storage: the framework's tensor no
 * longer holds it, so it goes. */
static inline void fake_fw_release(void *user, uint32_t id, void *dev,
                                   uint64_t bytes) {
  fake_fw_t *f = user;
  (void)bytes;
  f->releases++;
  if (f->n_released_ids < FAKE_FW_MAX)
    f->released_ids[f->n_released_ids++] = id;
  fake_fw_drop(f, dev);
}

#endif
