/*
 * Cost of the client's hot path: one op begin + op end with four tensors
 * (three inputs, one output, all on the device), sim backend.
 *
 *   guided    a plan is installed (actions on other tensors), none due at
 *             these accesses: the O(1) (tensor, access) lookups only
 *   recording the measured iteration: every op also goes into the recorder
 *             ring and out to a daemon (an in-process sink that answers
 *             Hello with Welcome and discards the rest)
 *   passive   no plan, not recording
 *
 * Prints median, 99th percentile and mean per op in ns. Each sample times
 * a batch of 16 begin+end pairs (clock overhead amortised).
 *   bench_client_hot_path [ops]   (default 200000)
 */
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "capuchin/client.h"
#include "capuchin/frame.h"
#include "capuchin/plan.h"
#include "capuchin/proto.h"
#include "client_impl.h" /* cap__client_load_plan: a plan without JSON */

#define BATCH 16

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int cmp64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x > y) - (x < y);
}

/* --- A sink daemon ------------------------------------------------------------ */
typedef struct sink {
  int lfd;
  char path[108];
  volatile int stop;
  uint64_t frames;
} sink_t;

static void *sink_main(void *arg) {
  sink_t *s = arg;
  int fd = -1;
  while (!s->stop && fd < 0) {
    struct pollfd pf = {.fd = s->lfd, .events = POLLIN};
    if (poll(&pf, 1, 50) > 0)
      fd = accept(s->lfd, NULL, NULL);
  }
  if (fd < 0)
    return NULL;
  cap_frame_decoder_t *d = cap_frame_decoder_create(NULL);
  static uint8_t buf[1 << 16];
  while (!s->stop) {
    struct pollfd pf = {.fd = fd, .events = POLLIN};
    if (poll(&pf, 1, 50) <= 0)
      continue;
    ssize_t n = read(fd, buf, sizeof buf);
    if (n <= 0)
      break;
    if (cap_frame_decoder_feed(d, buf, (size_t)n) < 0)
      break;
    Capuchin__Envelope *env;
    char err[128];
    int rc;
    while ((rc = cap_frame_decoder_next(d, &env, err, sizeof err)) != 0) {
      if (rc < 0)
        continue;
      s->frames++;
      if (env->msg_case == CAPUCHIN__ENVELOPE__MSG_HELLO) {
        Capuchin__Welcome w = CAPUCHIN__WELCOME__INIT;
        w.has_protocol_version = w.has_session_id = w.has_job_id = 1;
        w.protocol_version = CAP_PROTO_VERSION;
        w.session_id = w.job_id = 1;
        w.has_budget_bytes = 1;
        w.budget_bytes = env->hello->budget_bytes;
        w.has_plan_reused = 1;
        Capuchin__Envelope out = CAPUCHIN__ENVELOPE__INIT;
        cap_proto_envelope_set(&out, &w);
        uint8_t *fb;
        size_t fl;
        if (cap_frame_encode_alloc(&out, 0, &fb, &fl) == 0) {
          ssize_t wn = write(fd, fb, fl);
          (void)wn;
          free(fb);
        }
      }
      cap_frame_decoder_release(d, env);
    }
  }
  cap_frame_decoder_destroy(d);
  close(fd);
  return NULL;
}

static int sink_start(sink_t *s, pthread_t *th) {
  snprintf(s->path, sizeof s->path, "/tmp/capuchin-bench-%ld.sock", (long)getpid());
  unlink(s->path);
  s->lfd = socket(AF_UNIX, SOCK_STREAM, 0);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  memcpy(sa.sun_path, s->path, strlen(s->path) + 1);
  if (s->lfd < 0 || bind(s->lfd, (struct sockaddr *)&sa, sizeof sa) < 0 ||
      listen(s->lfd, 4) < 0)
    return -1;
  return pthread_create(th, NULL, sink_main, s);
}

/* --- The measurement ------------------------------------------------------------ */
typedef struct result {
  double median, p99, mean;
  uint64_t dropped;
  cap_mode_t mode;
} result_t;

static int measure(const char *what, size_t ops, result_t *res) {
  sink_t sink = {0};
  pthread_t sth;
  bool record = strcmp(what, "recording") == 0;
  if (record && sink_start(&sink, &sth) != 0) {
    fprintf(stderr, "bench: cannot start the sink daemon\n");
    return -1;
  }
  cap_client_config_t cfg;
  cap_client_config_init(&cfg);
  cfg.backend = "sim";
  cfg.no_daemon = !record;
  cfg.socket_path = record ? sink.path : NULL;
  cfg.connect_timeout_ms = 2000;
  cfg.ring_records = 1u << 20;
  cap_client_t *c;
  int rc = cap_client_create(&cfg, &c);
  if (rc < 0) {
    fprintf(stderr, "bench: client: %s\n", cap_strerror(rc));
    return -1;
  }
  /* Eight persistent tensors; the op uses 0,1,2 -> 3. */
  uint32_t ids[8];
  for (int i = 0; i < 8; i++)
    cap_client_register(c, 4096, CAP_KIND_PARAM, &ids[i], NULL);
  if (strcmp(what, "guided") == 0) {
    /* Actions on tensors 4..7 only, far beyond the accesses we make. */
    cap_plan_t *p = cap_plan_create("bench", 0);
    for (uint32_t t = 4; t < 8; t++)
      cap_plan_add_swap(p, t, 1000000, 5, 999999, 0);
    cap__client_load_plan(c, p);
    cap_plan_destroy(p);
  }
  const uint32_t in[3] = {ids[0], ids[1], ids[2]}, out[1] = {ids[3]};
  void *ip[3], *op[1];
  size_t n = ops / BATCH;
  int64_t *samples = malloc(n * sizeof *samples);
  cap_client_iteration_begin(c);
  /* Warm up (lazy pages, branch predictors). */
  for (int i = 0; i < 10000; i++) {
    cap_client_op_begin(c, "aten.bench", in, 3, out, 1, ip, op);
    cap_client_op_end(c);
  }
  for (size_t s = 0; s < n; s++) {
    int64_t t0 = now_ns();
    for (int k = 0; k < BATCH; k++) {
      cap_client_op_begin(c, "aten.bench", in, 3, out, 1, ip, op);
      cap_client_op_end(c);
    }
    samples[s] = now_ns() - t0;
    if (record && (s & 1023) == 1023)
      usleep(50); /* like a framework between kernels: the reporter runs */
  }
  cap_iter_stats_t st;
  cap_client_iteration_end(c, &st);
  res->mode = st.mode;
  res->dropped = st.dropped_records;
  qsort(samples, n, sizeof *samples, cmp64);
  double sum = 0;
  for (size_t i = 0; i < n; i++)
    sum += (double)samples[i];
  res->median = (double)samples[n / 2] / BATCH;
  res->p99 = (double)samples[(size_t)(n * 0.99)] / BATCH;
  res->mean = sum / n / BATCH;
  free(samples);
  cap_client_destroy(c);
  if (record) {
    sink.stop = 1;
    pthread_join(sth, NULL);
    close(sink.lfd);
    unlink(sink.path);
  }
  return 0;
}

int main(int argc, char **argv) {
  size_t ops = argc > 1 ? strtoull(argv[1], NULL, 10) : 200000;
  if (ops < 10 * BATCH)
    ops = 10 * BATCH;
  const char *modes[] = {"guided", "passive", "recording"};
  printf("op begin + op end, 4 tensors (3 in, 1 out), sim backend, %zu ops\n", ops);
  printf("%-10s %-9s %10s %10s %10s %10s\n", "case", "mode", "median_ns",
         "p99_ns", "mean_ns", "dropped");
  int status = 0;
  for (int i = 0; i < 3; i++) {
    result_t r = {0};
    if (measure(modes[i], ops, &r) < 0) {
      status = 1;
      continue;
    }
    printf("%-10s %-9s %10.1f %10.1f %10.1f %10" PRIu64 "\n", modes[i],
           cap_client_mode_name(r.mode), r.median, r.p99, r.mean, r.dropped);
  }
  return status;
}
