/*
 * Shared GPU budgets: how the memory of one device is split between the jobs
 * on it when their requests add up to more than it has. Each job keeps at
 * least its persistent bytes (below that no plan can exist); the rest is
 * shared in proportion to the requests (water-filling: a job whose
 * proportional share falls below its floor is pinned at the floor and the
 * others share what remains).
 *
 * Jobs are on one device when they report the same device UUID. A cut takes
 * effect at once; a job that confirms cuts (Hello acks_budget) is then
 * waited for: nobody on its device gets more, and no newcomer is welcomed,
 * until it says it holds no more than its new budget (BudgetAck) or
 * budget-ack-timeout-ms passes. Memory is handed over, never promised twice.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon_internal.h"

bool cap__budget_shares(const uint64_t *req, const uint64_t *floor_,
                        uint32_t n, uint64_t capacity, uint64_t *out) {
  unsigned __int128 total = 0;
  for (uint32_t i = 0; i < n; i++)
    total += req[i];
  if (total <= capacity) {
    for (uint32_t i = 0; i < n; i++)
      out[i] = req[i];
    return false;
  }
  bool *pinned = calloc(n ? n : 1, sizeof *pinned);
  if (!pinned) { /* degrade: plain proportional shares */
    for (uint32_t i = 0; i < n; i++)
      out[i] = (uint64_t)((unsigned __int128)capacity * req[i] / total);
    return true;
  }
  for (;;) {
    unsigned __int128 pinned_bytes = 0, free_req = 0;
    for (uint32_t i = 0; i < n; i++) {
      uint64_t fl = floor_[i] < req[i] ? floor_[i] : req[i];
      if (pinned[i])
        pinned_bytes += fl;
      else
        free_req += req[i];
    }
    unsigned __int128 left =
        pinned_bytes < capacity ? capacity - pinned_bytes : 0;
    bool changed = false;
    for (uint32_t i = 0; i < n; i++) {
      if (pinned[i])
        continue;
      uint64_t fl = floor_[i] < req[i] ? floor_[i] : req[i];
      uint64_t share =
          free_req ? (uint64_t)(left * req[i] / free_req) : 0;
      if (share > req[i])
        share = req[i];
      if (share < fl) {
        pinned[i] = true;
        changed = true;
      }
      out[i] = share;
    }
    if (!changed)
      break;
  }
  for (uint32_t i = 0; i < n; i++)
    if (pinned[i])
      out[i] = floor_[i] < req[i] ? floor_[i] : req[i];
  free(pinned);
  return true;
}

/* Two honest reports of one device agree within a quarter: the same card
 * reports the same total, and a MIG slice or a driver's reserve differs by
 * far less than a lie that matters. */
static bool near(uint64_t a, uint64_t b) {
  uint64_t lo = a < b ? a : b, hi = a < b ? b : a;
  return (unsigned __int128)hi * 4 <= (unsigned __int128)lo * 5;
}

uint64_t cap__budget_capacity(const uint64_t *claim, uint32_t n,
                              bool *ignored) {
  uint32_t best = UINT32_MAX, best_support = 0;
  for (uint32_t i = 0; i < n; i++) {
    if (!claim[i])
      continue;
    uint32_t support = 0;
    for (uint32_t j = 0; j < n; j++)
      support += claim[j] && near(claim[i], claim[j]);
    if (support > best_support) { /* ties: the older session's */
      best = i;
      best_support = support;
    }
  }
  uint64_t capacity = 0;
  for (uint32_t j = 0; j < n; j++) {
    bool agrees = best != UINT32_MAX && claim[j] && near(claim[best], claim[j]);
    if (ignored)
      ignored[j] = claim[j] && !agrees;
    if (agrees && claim[j] > capacity)
      capacity = claim[j];
  }
  return capacity;
}

/* --- Rebalancing the sessions of one device --------------------------------- */

/* The key jobs share a device by: its UUID; a client too old to send one
 * is keyed by ordinal and name as before (which every job in a container
 * sees as 0, so such jobs share one budget). */
static bool same_device(const cap__session_t *a, const cap__session_t *b) {
  if (a->device_uuid[0] || b->device_uuid[0])
    return strcmp(a->device_uuid, b->device_uuid) == 0;
  return a->device_index == b->device_index &&
         strcmp(a->device_name, b->device_name) == 0;
}

static bool holds_share(const cap__session_t *s) {
  return s->state == CAP__S_ACTIVE || s->state == CAP__S_WELCOMING;
}

/* Give s its new budget: the Welcome carries it while s is being
 * registered; else a new plan for it, or a BudgetUpdate while there is no
 * profile to plan from. A cut reaches a client that confirms cuts at once
 * (BudgetUpdate, the plan follows): the others wait for its confirmation,
 * which should not wait for planning. */
static void grant(cap_daemon_t *d, cap__session_t *s, uint64_t bytes,
                  bool cut) {
  bool shrink = bytes < s->granted_budget;
  s->granted_budget = bytes;
  if (s->state != CAP__S_ACTIVE)
    return;
  cap__work_store_budget(d, s->job_id, bytes);
  if (shrink && s->acks_budget) {
    s->trim_to = bytes;
    s->trim_deadline_ms = uv_now(d->loop) + d->cfg.budget_ack_timeout_ms;
  }
  if (!s->profile || (shrink && s->acks_budget)) {
    Capuchin__BudgetUpdate bu = CAPUCHIN__BUDGET_UPDATE__INIT;
    bu.has_budget_bytes = 1;
    bu.budget_bytes = bytes;
    bu.reason = cut ? "device shared with other jobs"
                    : "device no longer shared";
    Capuchin__Envelope env = CAPUCHIN__ENVELOPE__INIT;
    cap_proto_envelope_set(&env, &bu);
    cap__session_send_env(s, &env);
  }
  if (s->profile) {
    if (s->busy != CAP__W_NONE)
      s->want_replan = true;
    else
      cap__work_replan(s);
  }
}

void cap__daemon_rebalance(cap_daemon_t *d, const cap__session_t *who_) {
  uint32_t n = 0;
  for (cap__session_t *s = d->sessions; s; s = s->next)
    if (holds_share(s) && same_device(s, who_))
      n++;
  if (n == 0)
    return;
  cap__session_t **list = malloc(n * sizeof *list);
  uint64_t *req = malloc(n * sizeof *req), *fl = malloc(n * sizeof *fl),
           *out = malloc(n * sizeof *out), *claim = malloc(n * sizeof *claim);
  bool *ignored = malloc(n * sizeof *ignored);
  if (!list || !req || !fl || !out || !claim || !ignored)
    goto out_free;
  /* Oldest session first (the list is newest first): on a tie between
   * claims, the job that was there first is believed. */
  uint32_t i = n;
  for (cap__session_t *s = d->sessions; s; s = s->next)
    if (holds_share(s) && same_device(s, who_))
      list[--i] = s;
  for (i = 0; i < n; i++) {
    cap__session_t *s = list[i];
    req[i] = s->requested_budget;
    fl[i] = s->profile ? s->profile->persistent_bytes : s->hello_persistent;
    claim[i] = s->device_total_bytes;
  }
  /* The operator's word first; else what the clients agree on, so that no
   * one client can shrink (or inflate) a device the others share. */
  uint64_t capacity = who_->device_index < CAP_DAEMON_MAX_DEVICES
                          ? d->cfg.gpu_memory_dev[who_->device_index]
                          : 0;
  if (!capacity)
    capacity = d->cfg.gpu_memory_bytes;
  char w[320];
  if (!capacity) {
    capacity = cap__budget_capacity(claim, n, ignored);
    for (i = 0; i < n; i++) {
      cap__session_t *s = list[i];
      if (ignored[i] && !s->claim_ignored) {
        cap__log(CAP_LOG_WARN,
                 "%s: claims device %" PRIu32 " '%s' has %" PRIu64
                 " bytes, far from what the other jobs on it report (%" PRIu64
                 "); claim ignored (set gpu-memory to decide)",
                 cap__session_who(s, w, sizeof w), s->device_index,
                 s->device_name, s->device_total_bytes, capacity);
      }
      s->claim_ignored = ignored[i];
    }
  }
  if (capacity == 0)
    capacity = UINT64_MAX;
  bool cut = cap__budget_shares(req, fl, n, capacity, out);
  /* Cuts first; then, unless a cut is still unconfirmed, the growth. */
  bool waiting = false;
  for (int pass = 0; pass < 2; pass++) {
    for (i = 0; i < n; i++) {
      cap__session_t *s = list[i];
      bool grows = out[i] > s->granted_budget;
      if (out[i] == s->granted_budget || grows != (pass == 1))
        continue;
      if (grows && waiting && s->state == CAP__S_ACTIVE)
        continue; /* granted once the cut is confirmed */
      cap__log(CAP_LOG_INFO,
               "%s: budget %" PRIu64 " -> %" PRIu64 " (device %s: %" PRIu64
               " bytes shared by %" PRIu32 " jobs%s)",
               cap__session_who(s, w, sizeof w), s->granted_budget, out[i],
               s->device_uuid[0] ? s->device_uuid : s->device_name, capacity,
               n, cut ? "" : ", all requests fit");
      grant(d, s, out[i], cut);
    }
    for (i = 0; i < n; i++)
      waiting |= list[i]->trim_to != 0;
  }
  /* A newcomer is welcomed (its Hello registered) only once the memory
   * its share comes from is given back. */
  for (i = 0; i < n && !waiting; i++) {
    cap__session_t *s = list[i];
    if (s->state == CAP__S_WELCOMING && s->hello_deferred) {
      s->hello_deferred = false;
      cap__work_hello(s);
    }
  }
  if (waiting)
    for (i = 0; i < n; i++)
      if (list[i]->trim_to)
        cap__log(CAP_LOG_INFO,
                 "%s: the other jobs on device %s wait until it holds at most "
                 "%" PRIu64 " bytes (budget-ack-timeout-ms %" PRIu32 ")",
                 cap__session_who(list[i], w, sizeof w),
                 list[i]->device_uuid[0] ? list[i]->device_uuid
                                         : list[i]->device_name,
                 list[i]->trim_to, d->cfg.budget_ack_timeout_ms);
out_free:
  free(list);
  free(req);
  free(fl);
  free(out);
  free(claim);
  free(ignored);
}

void cap__budget_on_ack(cap__session_t *s, uint64_t budget_bytes,
                        uint64_t device_bytes) {
  char w[320];
  if (!s->trim_to || budget_bytes > s->trim_to)
    return; /* no cut waits (a grown budget), or one cut ago */
  if (device_bytes > s->trim_to) {
    cap__log(CAP_LOG_WARN,
             "%s: still holds %" PRIu64 " device bytes over its budget of "
             "%" PRIu64 "; the others on its device keep waiting",
             cap__session_who(s, w, sizeof w), device_bytes, s->trim_to);
    return;
  }
  cap__log(CAP_LOG_INFO,
           "%s: budget %" PRIu64 " confirmed, %" PRIu64 " device bytes held",
           cap__session_who(s, w, sizeof w), budget_bytes, device_bytes);
  s->trim_to = 0;
  cap__daemon_rebalance(s->d, s);
}

void cap__budget_sweep(cap_daemon_t *d) {
  uint64_t now = uv_now(d->loop);
  for (cap__session_t *s = d->sessions; s; s = s->next) {
    if (!s->trim_to || s->state != CAP__S_ACTIVE || now < s->trim_deadline_ms)
      continue;
    char w[320];
    cap__log(CAP_LOG_WARN,
             "%s: did not confirm its budget cut to %" PRIu64 " bytes within "
             "%" PRIu32 " ms (budget-ack-timeout-ms); the other jobs on its "
             "device get their shares anyway, and the device may be "
             "oversubscribed until it gives the memory back",
             cap__session_who(s, w, sizeof w), s->trim_to,
             d->cfg.budget_ack_timeout_ms);
    s->trim_to = 0;
    cap__daemon_rebalance(d, s);
  }
}
