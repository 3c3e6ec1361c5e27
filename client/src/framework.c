/*
 * The API of framework-owned memory (capuchin/framework.h): adopting the
 * framework's tensors, and bringing one back outside an op for a
 * saved-tensor unpack hook. The executor does the rest unchanged.
 */
#include <stdio.h>
#include <string.h>

#include "client_impl.h"

int cap_client_set_framework_memory(cap_client_t *c,
                                    cap_framework_alloc_fn alloc,
                                    cap_framework_release_fn release,
                                    void *user) {
  if (!c || !alloc || !release)
    return CAP_EINVAL;
  c->fw_alloc = alloc;
  c->fw_release = release;
  c->fw_user = user;
  return 0;
}

int cap_client_set_evictable(cap_client_t *c, uint32_t id, bool yes) {
  if (!c || id >= c->n_tensors || !c->tensors[id].persistent ||
      !c->tensors[id].framework)
    return CAP_EINVAL;
  c->tensors[id].evictable = yes;
  return 0;
}

void cap__rec_no_evict(cap_client_t *c) {
  /* Every one, each measured iteration: the daemon plans from the last
   * measured iteration only, and a new session knows nothing of the old. */
  if (c->n_tensors)
    cap__decl_upto(c, c->n_tensors - 1);
  for (uint32_t i = 0; i < c->n_tensors; i++) {
    const cap__tensor_t *t = &c->tensors[i];
    if (t->framework && t->persistent && !t->evictable &&
        !cap__rec_simple(c, CAP__REC_NO_EVICT, i, 0))
      c->it.dropped_records++;
  }
}

/* The tensor is on the device at the framework's dev. */
static void adopt(cap_client_t *c, uint32_t id, void *dev) {
  cap__tensor_t *t = &c->tensors[id];
  t->framework = 1;
  t->dev = dev;
  t->state = CAP__T_DEVICE;
  t->lru = ++c->tick;
  t->lent = cap__dev_owns(c->dev, dev);
  if (!t->lent)
    cap__dev_track_framework(c->dev, t->bytes ? t->bytes : 1, true);
  cap__note_over(c);
  if (!t->persistent)
    c->adopted_since_op += t->bytes;
}

int cap_client_adopt(cap_client_t *c, uint64_t bytes, void *dev,
                     uint32_t *id) {
  if (!c || !dev || !id)
    return CAP_EINVAL;
  if (!c->fw_alloc) {
    cap__set_error(c, "adopt: no framework memory callbacks");
    return CAP_ESTATE;
  }
  uint32_t i;
  int rc = cap_client_declare(c, bytes, &i);
  if (rc < 0)
    return rc;
  adopt(c, i, dev);
  *id = i;
  return 0;
}

int cap_client_adopt_persistent(cap_client_t *c, uint64_t bytes,
                                cap_tensor_kind_t kind, void *dev,
                                uint32_t *id) {
  if (!c || !dev || !id || (kind != CAP_KIND_PARAM && kind != CAP_KIND_INPUT) ||
      c->op_open)
    return CAP_EINVAL;
  if (!c->fw_alloc) {
    cap__set_error(c, "adopt: no framework memory callbacks");
    return CAP_ESTATE;
  }
  if (c->n_tensors >= (1u << 31))
    return CAP_ERANGE;
  int rc = cap__tensor_grow(c, c->n_tensors + 1);
  if (rc < 0)
    return rc;
  uint32_t i = c->n_tensors++;
  cap__tensor_t *t = &c->tensors[i];
  memset(t, 0, sizeof *t);
  t->out_action = CAP_NONE;
  t->bytes = bytes;
  t->kind = (uint8_t)kind;
  t->persistent = 1;
  adopt(c, i, dev);
  c->persistent_bytes += bytes;
  atomic_store(&c->ctr.persistent_bytes, c->persistent_bytes);
  if (c->recording)
    cap__decl_upto(c, i);
  *id = i;
  return 0;
}

int cap_client_acquire(cap_client_t *c, uint32_t id, void **dev) {
  if (!c || !dev)
    return CAP_EINVAL;
  if (c->op_open) {
    cap__set_error(c, "acquire inside an op");
    return CAP_ESTATE;
  }
  if (id >= c->n_tensors || c->tensors[id].state == CAP__T_UNUSED) {
    cap__set_error(c, "acquire: tensor %u is not live", id);
    return CAP_EINVAL;
  }
  cap__tensor_t *t = &c->tensors[id];
  if (t->state != CAP__T_DEVICE) {
    /* Named in the errors of the restore, as an op would be. */
    c->op_name = "acquire";
    t->pinned++;
    int rc = cap__ensure_resident(c, id, false);
    t->pinned--;
    if (rc < 0)
      return rc;
  }
  *dev = t->dev;
  return 0;
}

bool cap__fw_wait_room(cap_client_t *c, uint64_t bytes) {
  /* No queued prefetch starts while room is made for this allocation: it
   * would take what the waits free. */
  bool pumping = c->pf_pumping;
  c->pf_pumping = true;
  bool fits = true;
  while (cap__dev_in_use(c->dev) + bytes > c->budget_bytes) {
    if (c->n_retire)
      cap__reap(c, false);
    if (cap__dev_in_use(c->dev) + bytes <= c->budget_bytes)
      break;
    if (!cap__retire_wait_one(c)) {
      fits = false;
      break;
    }
  }
  c->pf_pumping = pumping;
  return fits;
}

/* The bytes the next op's outputs take: what the framework adopted for
 * them in the last complete iteration. A guided iteration follows that op
 * sequence (the framework says when it stops: cap_client_diverged), and
 * the plan placed the outputs at the op's start, beside its prefetches;
 * the framework allocates them while the op runs, before it reports it,
 * so the room must be made now. */
static uint64_t next_op_bytes(const cap_client_t *c) {
  if (c->mode != CAP_MODE_GUIDED || !c->log_last_valid ||
      c->op_seq >= c->log_last.n_ops)
    return 0;
  return c->log_last.ops[c->op_seq].adopted_bytes;
}

uint64_t cap__fw_outputs_to_come(const cap_client_t *c) {
  uint64_t want = next_op_bytes(c);
  return want > c->adopted_since_op ? want - c->adopted_since_op : 0;
}

int cap_client_make_room(cap_client_t *c) {
  if (!c)
    return CAP_EINVAL;
  return cap__fw_wait_room(c, cap__fw_outputs_to_come(c)) ? 1 : 0;
}

bool cap_client_op_replayed(cap_client_t *c, uint32_t seq) {
  return c && c->x.plan && c->mode == CAP_MODE_GUIDED && seq < c->x.n_replays &&
         c->x.replays[seq];
}

cap_mode_t cap_client_mode(cap_client_t *c) {
  return c ? c->mode : CAP_MODE_PASSIVE;
}

int cap_client_poll(cap_client_t *c) {
  if (!c)
    return CAP_EINVAL;
  if (c->n_retire || c->n_pf) /* (reaping starts queued prefetches) */
    cap__reap(c, false);
  return (int)c->n_retire;
}

bool cap_client_copying(cap_client_t *c, const void *dev) {
  if (!c || !dev)
    return false;
  /* A swap-out pushes its deferred release when it starts, and freeing a
   * tensor whose copy in is running turns that copy into one: the list
   * holds every copy that will end in release(dev). */
  for (uint32_t i = 0; i < c->n_retire; i++)
    if (c->retire[i].dev == dev && c->retire[i].dev_of != CAP_NONE)
      return true;
  return false;
}

int cap_client_tensor_resident(cap_client_t *c, uint32_t id) {
  if (!c || id >= c->n_tensors || c->tensors[id].state == CAP__T_UNUSED)
    return CAP_EINVAL;
  return c->tensors[id].state == CAP__T_DEVICE;
}

int cap_client_op_run(cap_client_t *c, const char *name, const uint32_t *in,
                      uint32_t n_in, const uint32_t *out, uint32_t n_out,
                      int64_t duration_ns) {
  if (!c || duration_ns < 0)
    return CAP_EINVAL;
  int rc = cap_client_op_begin(c, name, in, n_in, out, n_out, NULL, NULL);
  if (rc < 0)
    return rc;
  if (!c->log_failed && c->log_cur.n_ops)
    c->log_cur.ops[c->log_cur.n_ops - 1].adopted_bytes = c->adopted_since_op;
  c->adopted_since_op = 0;
  /* The op ran before it was reported; it cannot have started before the
   * iteration did. */
  int64_t start = cap__now_ns(c->dev) - duration_ns;
  c->op_start_ns = start > c->iter_start_ns ? start : c->iter_start_ns;
  if (c->device_timeline && c->recording) {
    /* The host's time since the last op ended is not the device's: it
     * goes out of the timeline as a host wait does (cap__rec_time_ns). */
    int64_t gap = cap__rec_time_ns(c, c->op_start_ns) - c->rec_end_ns;
    if (gap > 0)
      c->host_wait_ns += gap;
  }
  return cap__op_end(c);
}

int cap_client_set_device_timeline(cap_client_t *c, bool on) {
  if (!c)
    return CAP_EINVAL;
  c->device_timeline = on;
  return 0;
}

int cap_client_diverged(cap_client_t *c) {
  if (!c)
    return CAP_EINVAL;
  if (!c->in_iter) {
    cap__set_error(c, "diverged outside an iteration");
    return CAP_ESTATE;
  }
  if (c->mode == CAP_MODE_GUIDED) {
    c->mode = CAP_MODE_PASSIVE;
    c->it.mode = CAP_MODE_PASSIVE;
    snprintf(c->it.plan_note, sizeof c->it.plan_note,
             "the iteration left the plan's op sequence at op %u: plan "
             "suspended for the rest of it", c->op_seq);
  }
  return 0;
}
