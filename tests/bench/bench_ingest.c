/*
 * capuchind ingest benchmark: access records per second that one
 * daemon loop takes in from 1 and 32 concurrent clients replaying a real
 * trace (compact AccessBatch frames, as libcapuchin-client's reporter sends
 * them), and the loop's worst stall (lateness of a 1 ms timer on the loop)
 * while idle, while ingesting, and while a plan is computed off the loop.
 *
 *   bench_ingest [--trace FILE] [--plan-trace FILE] [--accesses N]
 *
 * The daemon runs in-process on its own thread (cap_daemon_run), clients on
 * threads over its Unix socket; frames are encoded before the clock starts.
 * An access record is one tensor in one op's inputs or outputs.
 */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>

#include "../integration/testclient.h"
#include "cap_test.h"
#include "capuchin/daemon.h"
#include "capuchin/trace.h"

typedef struct frames {
  uint8_t *buf;
  size_t len, cap;
} frames_t;

static cap_profile_t *P;
static uint64_t accesses_per_iter;
static frames_t *iters; /* per iteration number: batch + IterationEnd */
static uint32_t n_iters;

static int encode_iteration(frames_t *f, const cap_profile_t *p, uint64_t it,
                            bool declare, bool measured) {
  cap_proto_batch_t *b = cap_proto_batch_create();
  cap_proto_batch_reset(b, it);
  if (declare)
    for (uint32_t t = 0; t < p->n_tensors; t++)
      cap_proto_batch_add_decl(b, t, p->tensors[t].bytes, p->tensors[t].kind);
  uint32_t in_batch = 0;
  for (uint32_t i = 0; i < p->n_ops; i++) {
    const cap_op_t *op = &p->ops[i];
    cap_proto_batch_add_op(b, i, op->start_ns, op->end_ns, op->name,
                           cap_op_inputs(p, op), op->n_in,
                           cap_op_outputs(p, op), op->n_out);
    if (++in_batch == 4096) {
      cap_proto_batch_append_frame(b, 0, &f->buf, &f->len, &f->cap);
      cap_proto_batch_reset(b, it);
      in_batch = 0;
    }
  }
  for (uint32_t i = 0; i < p->n_frees; i++)
    cap_proto_batch_add_free(b, p->frees[i].t_ns, p->frees[i].tensor);
  int rc = cap_proto_batch_append_frame(b, 0, &f->buf, &f->len, &f->cap);
  cap_proto_batch_destroy(b);
  Capuchin__IterationEnd e = CAPUCHIN__ITERATION_END__INIT;
  e.has_iteration = e.has_iter_ns = e.has_peak_bytes = e.has_bytes_out = 1;
  e.has_bytes_in = e.has_stall_ns = e.has_measured = e.has_incomplete = 1;
  e.has_mode = 1;
  e.iteration = it;
  e.iter_ns = p->iter_ns;
  e.measured = measured;
  e.mode = measured ? CAPUCHIN__MODE__MODE_MEASURED
                    : CAPUCHIN__MODE__MODE_PASSIVE;
  Capuchin__Envelope env = CAPUCHIN__ENVELOPE__INIT;
  cap_proto_envelope_set(&env, &e);
  return rc ? rc : cap_frame_append(&env, 0, &f->buf, &f->len, &f->cap);
}

typedef struct daemon_run {
  cap_daemon_t *d;
  pthread_t th;
  char dir[64];
  char sock[128];
} daemon_run_t;

static void *daemon_main(void *arg) {
  daemon_run_t *r = arg;
  cap_daemon_run(r->d, 0);
  return NULL;
}

static int daemon_start(daemon_run_t *r) {
  snprintf(r->dir, sizeof r->dir, "/tmp/capd-bench-XXXXXX");
  if (!mkdtemp(r->dir))
    return -1;
  cap_daemon_config_t cfg;
  cap_daemon_config_init(&cfg);
  snprintf(cfg.socket_path, sizeof cfg.socket_path, "%s/s.sock", r->dir);
  snprintf(r->sock, sizeof r->sock, "%s", cfg.socket_path);
  snprintf(cfg.db_path, sizeof cfg.db_path, "%s/capuchin.db", r->dir);
  cfg.log_level = CAP_LOG_WARN;
  cfg.stall_probe_ms = 1;
  char err[512];
  if (cap_daemon_create(&cfg, NULL, &r->d, err, sizeof err) != 0) {
    fprintf(stderr, "bench: %s\n", err);
    return -1;
  }
  return pthread_create(&r->th, NULL, daemon_main, r);
}

static void daemon_finish(daemon_run_t *r, cap_daemon_stats_t *st) {
  cap_daemon_stop(r->d);
  pthread_join(r->th, NULL);
  cap_daemon_get_stats(r->d, st);
  cap_daemon_destroy(r->d);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", r->dir);
  if (system(cmd) != 0)
    fprintf(stderr, "cannot remove %s\n", r->dir);
}

typedef struct client_arg {
  const char *sock;
  uint32_t first, n; /* iterations [first, first + n) of iters[] */
  pthread_barrier_t *go;
  uint64_t end_ns;
  int ok;
} client_arg_t;

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void *client_main(void *arg) {
  client_arg_t *a = arg;
  tc_t c;
  bool up = tc_connect(&c, a->sock) == 0;
  tc_hello_args_t h = {.job = "bench", .budget_bytes = 1ull << 36};
  up = up && tc_hello(&c, &h, NULL, 30000) == 0;
  pthread_barrier_wait(a->go);
  if (!up)
    return NULL;
  bool sent = true;
  for (uint32_t i = 0; i < a->n && sent; i++)
    sent = tc_send_raw(&c, iters[i].buf, iters[i].len) == 0;
  Capuchin__Bye bye = CAPUCHIN__BYE__INIT;
  tc_send_msg(&c, &bye);
  /* The daemon closes after it has processed everything before the Bye. */
  a->ok = sent && tc_wait_closed(&c, 600000);
  a->end_ns = now_ns();
  tc_close(&c);
  return NULL;
}

static void run_ingest(uint32_t n_clients, uint64_t target) {
  daemon_run_t r;
  if (daemon_start(&r) != 0)
    exit(1);
  uint32_t per = (uint32_t)((target / accesses_per_iter + n_clients - 1) /
                            n_clients);
  if (per > n_iters)
    per = n_iters;
  if (per == 0)
    per = 1;
  pthread_barrier_t go;
  pthread_barrier_init(&go, NULL, n_clients + 1);
  client_arg_t *args = calloc(n_clients, sizeof *args);
  pthread_t *th = calloc(n_clients, sizeof *th);
  for (uint32_t i = 0; i < n_clients; i++) {
    args[i] = (client_arg_t){.sock = r.sock, .n = per, .go = &go};
    pthread_create(&th[i], NULL, client_main, &args[i]);
  }
  pthread_barrier_wait(&go);
  uint64_t t0 = now_ns(), t1 = t0;
  int ok = 0;
  for (uint32_t i = 0; i < n_clients; i++) {
    pthread_join(th[i], NULL);
    ok += args[i].ok;
    if (args[i].end_ns > t1)
      t1 = args[i].end_ns;
  }
  cap_daemon_stats_t st;
  daemon_finish(&r, &st);
  double s = (double)(t1 - t0) / 1e9;
  uint64_t total = (uint64_t)per * n_clients * accesses_per_iter;
  printf("| ingest, %2u client%s    | %9.2f M/s | %10llu accesses in %.2f s "
         "(daemon counted %llu) | worst loop stall %.2f ms | %u/%u clients "
         "ok |\n",
         n_clients, n_clients == 1 ? " " : "s", (double)total / s / 1e6,
         (unsigned long long)total, s, (unsigned long long)st.accesses_in,
         (double)st.max_loop_stall_ns / 1e6, ok, n_clients);
  pthread_barrier_destroy(&go);
  free(args);
  free(th);
}

static void run_idle(void) {
  daemon_run_t r;
  if (daemon_start(&r) != 0)
    exit(1);
  usleep(1000000);
  cap_daemon_stats_t st;
  daemon_finish(&r, &st);
  printf("| idle for 1 s          | %14s | %50s | worst loop stall %.2f ms | "
         "%14s |\n",
         "-", "-", (double)st.max_loop_stall_ns / 1e6, "-");
}

static void run_plan(const char *trace) {
  cap_profile_t *p = NULL;
  char err[512];
  if (cap_trace_load(trace, &p, err, sizeof err) != 0) {
    fprintf(stderr, "%s\n", err);
    exit(1);
  }
  frames_t f = {0};
  encode_iteration(&f, p, 1, true, true);
  daemon_run_t r;
  if (daemon_start(&r) != 0)
    exit(1);
  tc_t c;
  tc_hello_args_t h = {.job = "bench-plan",
                       .budget_bytes = cap_profile_budget_pct(p, 50)};
  uint64_t plan_ms = 0;
  bool got = false, infeasible = false;
  if (tc_connect(&c, r.sock) == 0 && tc_hello(&c, &h, NULL, 30000) == 0) {
    uint64_t t0 = tc_now_ms();
    tc_send_raw(&c, f.buf, f.len);
    /* A Plan, or a BudgetUpdate when no plan fits. */
    for (;;) {
      Capuchin__Envelope *env = tc_recv(&c, 120000);
      if (!env)
        break;
      int mc = (int)env->msg_case;
      tc_release(&c, env);
      if (mc == CAPUCHIN__ENVELOPE__MSG_PLAN ||
          mc == CAPUCHIN__ENVELOPE__MSG_BUDGET_UPDATE) {
        got = mc == CAPUCHIN__ENVELOPE__MSG_PLAN;
        infeasible = !got;
        break;
      }
    }
    plan_ms = tc_now_ms() - t0;
    tc_close(&c);
  }
  cap_daemon_stats_t st;
  daemon_finish(&r, &st);
  const char *base = strrchr(trace, '/');
  printf("| plan %-16s | %14s | %s after %4llu ms (ingest + planning + "
         "store) | worst loop stall %.2f ms | %14s |\n",
         base ? base + 1 : trace, "-",
         got ? "plan pushed  " : infeasible ? "infeasible   " : "NO ANSWER    ",
         (unsigned long long)plan_ms, (double)st.max_loop_stall_ns / 1e6,
         "-");
  free(f.buf);
  cap_profile_destroy(p);
}

int main(int argc, char **argv) {
  const char *trace = cap_test_data("traces/resnet50.trace");
  char trace_buf[4096], plan_buf[4096];
  snprintf(trace_buf, sizeof trace_buf, "%s", trace);
  snprintf(plan_buf, sizeof plan_buf, "%s",
           cap_test_data("traces/bert_large.trace"));
  trace = trace_buf;
  const char *plan_trace = plan_buf;
  uint64_t target = 8000000;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--trace") == 0 && i + 1 < argc)
      trace = argv[++i];
    else if (strcmp(argv[i], "--plan-trace") == 0 && i + 1 < argc)
      plan_trace = argv[++i];
    else if (strcmp(argv[i], "--accesses") == 0 && i + 1 < argc)
      target = strtoull(argv[++i], NULL, 10);
    else {
      fprintf(stderr, "usage: bench_ingest [--trace FILE] [--plan-trace FILE] "
                      "[--accesses N]\n");
      return 64;
    }
  }
  (void)cap_test_passed; /* cap_test.h is here for cap_test_data() */
  (void)cap_test_failed;
  (void)cap_test_failed_checks;
  signal(SIGPIPE, SIG_IGN);
  char err[512];
  if (cap_trace_load(trace, &P, err, sizeof err) != 0) {
    fprintf(stderr, "%s\n", err);
    return 1;
  }
  accesses_per_iter = P->n_op_tensors;
  n_iters = (uint32_t)(target / accesses_per_iter + 1);
  iters = calloc(n_iters, sizeof *iters);
  for (uint32_t i = 0; i < n_iters; i++)
    encode_iteration(&iters[i], P, i + 1, i == 0, false);
  printf("capuchind ingest: %s, %llu accesses per iteration, %ld CPUs\n\n",
         trace, (unsigned long long)accesses_per_iter,
         sysconf(_SC_NPROCESSORS_ONLN));
  printf("| phase                 | rate           | work | loop | clients |\n"
         "| --- | --- | --- | --- | --- |\n");
  run_idle();
  run_ingest(1, target);
  run_ingest(32, target);
  run_plan(trace);
  run_plan(plan_trace);
  for (uint32_t i = 0; i < n_iters; i++)
    free(iters[i].buf);
  free(iters);
  cap_profile_destroy(P);
  return 0;
}
