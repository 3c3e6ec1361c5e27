/*
 * Deferred releases: memory that a copy on another stream still reads or
 * writes goes back only when the copy's event has completed (as PyTorch's
 * caching allocator holds a block used on another stream). A finished
 * swap-out also moves its tensor from OUT to HOST here.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_impl.h"

int cap__retire_push(cap_client_t *c, cap__ev_t *ev, void *dev, void *host,
                     uint64_t host_bytes, uint32_t tensor, uint32_t dev_of) {
  if (c->n_retire == c->cap_retire) {
    uint32_t n = c->cap_retire ? c->cap_retire * 2 : 64;
    cap__retire_t *r = realloc(c->retire, (size_t)n * sizeof *r);
    if (!r)
      return CAP_ENOMEM;
    c->retire = r;
    c->cap_retire = n;
  }
  uint64_t dev_bytes = 0;
  if (dev_of != CAP_NONE)
    dev_bytes = c->tensors[dev_of].bytes ? c->tensors[dev_of].bytes : 1;
  c->retire[c->n_retire++] =
      (cap__retire_t){ev, dev, host, host_bytes, tensor, dev_of, dev_bytes};
  return 0;
}

/* The device memory a finished copy held goes back to its owner: the
 * client's allocator, or the framework through its release callback (by
 * then the tensor's id may name another tensor: the size was kept). */
static void release_dev(cap_client_t *c, cap__retire_t *r) {
  if (!r->dev)
    return;
  if (r->dev_of == CAP_NONE) {
    cap__dev_free(c->dev, r->dev);
    return;
  }
  if (!cap__dev_owns(c->dev, r->dev)) /* the framework frees it after this */
    cap__dev_track_framework(c->dev, r->dev_bytes, false);
  cap__fw_release(c, r->dev_of, r->dev, r->dev_bytes);
}

void cap__retire_finish(cap_client_t *c, cap__retire_t *r, int status) {
  if (r->tensor != CAP_NONE) {
    /* A swap-out: on success the device copy goes; on failure the device
     * copy is the only one, so it stays and the host buffer goes. */
    cap__tensor_t *t = &c->tensors[r->tensor];
    if (status >= 0) {
      t->state = CAP__T_HOST;
      release_dev(c, r);
      t->dev = NULL;
    } else {
      t->state = CAP__T_DEVICE;
      cap__host_free(c->dev, t->host, t->bytes);
      t->host = NULL;
      atomic_fetch_add(&c->ctr.fallbacks, 1);
      c->it.fallbacks++;
    }
    atomic_store(&c->ctr.device_bytes, cap__dev_in_use(c->dev));
  } else {
    release_dev(c, r);
    if (r->host)
      cap__host_free(c->dev, r->host, r->host_bytes);
  }
  cap__ev_release(c->dev, r->ev);
}

void cap__reap(cap_client_t *c, bool wait_all) {
  uint32_t j = 0;
  cap__poll_t poll;
  cap__poll_begin(&poll);
  for (uint32_t i = 0; i < c->n_retire; i++) {
    cap__retire_t *r = &c->retire[i];
    int st = wait_all ? cap__ev_sync(c->dev, r->ev)
                      : cap__ev_poll(c->dev, r->ev, &poll);
    if (wait_all && st == 0)
      st = 1;
    if (st != 0) {
      cap__retire_finish(c, r, st);
    } else {
      c->retire[j++] = *r;
    }
  }
  c->n_retire = j;
  if (c->n_pf && !wait_all)
    cap__prefetch_pump(c);
}

cap__retire_t *cap__retire_of(cap_client_t *c, uint32_t tensor) {
  for (uint32_t i = 0; i < c->n_retire; i++)
    if (c->retire[i].tensor == tensor)
      return &c->retire[i];
  return NULL;
}

/* Finish pending copy i in compute-stream order and drop it from the
 * queue: the compute stream waits for the copy, and its memory goes back
 * now. What reuses that memory runs on the compute stream after the wait
 * (the framework's caching allocator is stream-ordered, the client's own
 * allocations feed ops there, and every copy is ordered after what the
 * compute stream has issued), so it cannot touch the memory before the
 * copy is done; and the host does not wait. A host wait here would drain
 * the lead a GPU job's host keeps over its device, each time the budget
 * needs a swap-out's memory. Where compute is the host's (sim), the wait
 * is the host's and counts as one. The wait is a stall. */
static void wait_and_finish(cap_client_t *c, uint32_t i) {
  cap__retire_t *r = &c->retire[i];
  int64_t t0 = cap__now_ns(c->dev);
  int st = cap__ev_compute_wait(c->dev, r->ev);
  cap__note_wait(c, cap__now_ns(c->dev) - t0, cap__dev_host_compute(c->dev));
  c->it.budget_waits++;
  cap__retire_finish(c, r, st < 0 ? st : 1);
  memmove(r, r + 1, (c->n_retire - i - 1) * sizeof *r);
  c->n_retire--;
}

bool cap__retire_wait_dev(cap_client_t *c, const void *dev) {
  for (uint32_t i = 0; i < c->n_retire; i++)
    if (c->retire[i].dev == dev) {
      wait_and_finish(c, i);
      return true;
    }
  return false;
}

/* Wait for the oldest pending swap-out that frees device memory. */
bool cap__retire_wait_one(cap_client_t *c) {
  for (uint32_t i = 0; i < c->n_retire; i++)
    if (c->retire[i].tensor != CAP_NONE || c->retire[i].dev) {
      wait_and_finish(c, i);
      return true;
    }
  return false;
}
