/*
 * The store's write queue: rows and updates nobody waits for (iteration
 * rows, budget changes, a job's end) go through one FIFO that a single
 * work task drains, up to STORE_BATCH of them per transaction.
 *
 * Why not one uv_queue_work per write: libuv's thread pool is one FIFO for
 * all work, so a client that sends IterationEnd frames as fast as it can
 * queued one task per frame ahead of every other client's Hello and
 * planning (400 000 frames made a Hello wait 34 s). Here at most one writer
 * task is in the pool at a time, and a Hello waits at most for one batch's
 * transaction on the store's lock. Each session may have at most
 * max-queued-store-rows iteration rows queued or being written; at the
 * bound its input is paused (session.c) until the writer catches up, so a
 * client that outruns the store is slowed to the store's pace, not cut.
 */
#include <inttypes.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon_internal.h"

/* Rows per transaction: large enough that one fsync serves many rows,
 * small enough that a Hello waiting on the store's lock waits a few ms. */
#define STORE_BATCH 256u

typedef enum { ITEM_ITERATION, ITEM_BUDGET, ITEM_END, ITEM_TRIM } item_kind_t;

struct cap__store_item {
  cap__store_item_t *next;
  item_kind_t kind;
  cap__session_t *s; /* iteration rows: held, counted in s->store_queued */
  cap_store_iteration_t it;
  int64_t job_id, session_id;
  uint64_t bytes;
  char status[160];
};

typedef struct writer {
  uv_work_t req;
  cap_daemon_t *d;
  cap_store_t *store;
  cap__store_item_t *batch; /* taken from the queue, in order */
  cap_store_iteration_t rows[STORE_BATCH];
} writer_t;

static void log_store_error(const char *what) {
  cap__log(CAP_LOG_ERROR, "store: %s: %s", what, cap_store_last_error());
}

static void flush_rows(writer_t *w, uint32_t *n) {
  if (*n == 0)
    return;
  uint32_t skipped = 0;
  if (cap_store_iterations_put(w->store, w->rows, *n, &skipped) != 0)
    log_store_error("storing iterations");
  else if (skipped)
    cap__log(CAP_LOG_WARN,
             "store: %" PRIu32 " iteration rows with values out of range "
             "not stored",
             skipped);
  *n = 0;
}

static void writer_work(uv_work_t *req) {
  writer_t *w = req->data;
  uint32_t n = 0;
  for (cap__store_item_t *i = w->batch; i; i = i->next) {
    if (i->kind == ITEM_ITERATION) {
      w->rows[n++] = i->it;
      continue;
    }
    flush_rows(w, &n); /* keep the order of the events */
    if (i->kind == ITEM_TRIM) {
      cap_store_release_memory(w->store);
#ifdef __GLIBC__
      malloc_trim(0);
#endif
    } else if (i->kind == ITEM_BUDGET) {
      if (cap_store_job_set_budget(w->store, i->job_id, i->bytes) != 0)
        log_store_error("storing a budget");
    } else {
      int rc = 0;
      if (i->session_id)
        rc = cap_store_session_end(w->store, i->session_id, i->status);
      if (rc == 0)
        rc = cap_store_job_end(w->store, i->job_id, i->status);
      if (rc)
        log_store_error("recording a job's end");
    }
  }
  flush_rows(w, &n);
}

static void kick_writer(cap_daemon_t *d);

static void release(cap_daemon_t *d, cap__store_item_t *i) {
  cap__session_t *s = i->s;
  free(i);
  if (!s)
    return;
  s->store_queued--;
  if (s->store_blocked && s->store_queued < d->cfg.max_queued_store_rows) {
    s->store_blocked = false;
    cap__session_kick(s); /* drains what waited and resumes input */
  }
  cap__session_unref(s);
}

static void writer_after(uv_work_t *req, int status) {
  writer_t *w = req->data;
  cap_daemon_t *d = w->d;
  (void)status;
  cap__store_item_t *i = w->batch;
  free(w);
  d->store_writing = false;
  while (i) {
    cap__store_item_t *next = i->next;
    release(d, i);
    i = next;
  }
  kick_writer(d);
}

static void kick_writer(cap_daemon_t *d) {
  if (d->store_writing || !d->sq_head)
    return;
  writer_t *w = calloc(1, sizeof *w);
  if (!w)
    return; /* retried at the next enqueue */
  w->req.data = w;
  w->d = d;
  w->store = d->store;
  cap__store_item_t **tail = &w->batch;
  for (uint32_t n = 0; n < STORE_BATCH && d->sq_head; n++) {
    cap__store_item_t *i = d->sq_head;
    d->sq_head = i->next;
    i->next = NULL;
    *tail = i;
    tail = &i->next;
  }
  if (!d->sq_head)
    d->sq_tail = NULL;
  if (uv_queue_work(d->loop, &w->req, writer_work, writer_after) != 0) {
    cap__log(CAP_LOG_ERROR, "store: cannot queue a write");
    cap__store_item_t *i = w->batch;
    free(w);
    while (i) {
      cap__store_item_t *next = i->next;
      release(d, i);
      i = next;
    }
    return;
  }
  d->store_writing = true;
}

static void enqueue(cap_daemon_t *d, cap__store_item_t *i) {
  if (d->sq_tail)
    d->sq_tail->next = i;
  else
    d->sq_head = i;
  d->sq_tail = i;
  kick_writer(d);
}

void cap__work_store_iteration(cap__session_t *s,
                               const cap_store_iteration_t *it) {
  if (!it->job_id)
    return;
  cap__store_item_t *i = calloc(1, sizeof *i);
  if (!i)
    return;
  i->kind = ITEM_ITERATION;
  i->it = *it;
  i->s = s;
  s->refs++;
  if (++s->store_queued >= s->d->cfg.max_queued_store_rows &&
      !s->store_blocked) {
    s->store_blocked = true;
    cap__log(CAP_LOG_DEBUG,
             "session %" PRIu64 ": %" PRIu32 " iteration rows wait for the "
             "store; its input is paused until they are written",
             s->local_id, s->store_queued);
  }
  enqueue(s->d, i);
}

void cap__work_store_budget(cap_daemon_t *d, int64_t job_id, uint64_t bytes) {
  if (!job_id)
    return;
  cap__store_item_t *i = calloc(1, sizeof *i);
  if (!i)
    return;
  i->kind = ITEM_BUDGET;
  i->job_id = job_id;
  i->bytes = bytes;
  enqueue(d, i);
}

void cap__work_store_end(cap_daemon_t *d, int64_t job_id, int64_t session_id,
                         const char *status) {
  if (!job_id)
    return;
  cap__store_item_t *i = calloc(1, sizeof *i);
  if (!i)
    return;
  i->kind = ITEM_END;
  i->job_id = job_id;
  i->session_id = session_id;
  snprintf(i->status, sizeof i->status, "%s", status ? status : "ok");
  enqueue(d, i);
}

void cap__work_store_trim(cap_daemon_t *d) {
  /* One is enough: a trim already waiting will run after this close. */
  for (cap__store_item_t *i = d->sq_head; i; i = i->next)
    if (i->kind == ITEM_TRIM)
      return;
  cap__store_item_t *i = calloc(1, sizeof *i);
  if (!i)
    return;
  i->kind = ITEM_TRIM;
  enqueue(d, i);
}

void cap__store_queue_drop(cap_daemon_t *d) {
  cap__store_item_t *i = d->sq_head;
  d->sq_head = d->sq_tail = NULL;
  while (i) {
    cap__store_item_t *next = i->next;
    release(d, i);
    i = next;
  }
}
