/* Implementation of testclient.h (static functions; included from it). */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define TC_UNUSED __attribute__((unused))

static TC_UNUSED uint64_t tc_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static TC_UNUSED uint64_t tc_rss_kb(pid_t pid) {
  char path[64], line[256];
  snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
  FILE *f = fopen(path, "r");
  if (!f)
    return 0;
  uint64_t kb = 0;
  while (fgets(line, sizeof line, f))
    if (strncmp(line, "VmRSS:", 6) == 0) {
      kb = strtoull(line + 6, NULL, 10);
      break;
    }
  fclose(f);
  return kb;
}

static TC_UNUSED int tc_daemon_start(tc_daemon_t *d, const char *dir,
                                     const char *const *extra) {
  memset(d, 0, sizeof *d);
  d->notify_fd = -1;
  if (dir) {
    snprintf(d->dir, sizeof d->dir, "%s", dir);
  } else {
    snprintf(d->dir, sizeof d->dir, "/tmp/capd-test-XXXXXX");
    if (!mkdtemp(d->dir))
      return -1;
    chmod(d->dir, 0755); /* other uids reach the socket in tests */
  }
  snprintf(d->sock, sizeof d->sock, "%s/capuchind.sock", d->dir);
  snprintf(d->db, sizeof d->db, "%s/capuchin.db", d->dir);
  snprintf(d->log, sizeof d->log, "%s/capuchind.log", d->dir);
  snprintf(d->notify, sizeof d->notify, "%s/notify.sock", d->dir);
  unlink(d->notify);
  d->notify_fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  snprintf(sa.sun_path, sizeof sa.sun_path, "%.100s", d->notify);
  if (d->notify_fd < 0 ||
      bind(d->notify_fd, (struct sockaddr *)&sa, sizeof sa) != 0)
    return -1;
  const char *argv[64];
  int n = 0;
  argv[n++] = CAP_BIN_DIR "/capuchind";
  argv[n++] = "--socket";
  argv[n++] = d->sock;
  argv[n++] = "--db";
  argv[n++] = d->db;
  argv[n++] = "--log-level";
  argv[n++] = "debug";
  for (int i = 0; extra && extra[i] && n < 62; i++)
    argv[n++] = extra[i];
  argv[n] = NULL;
  pid_t test_pid = getpid();
  pid_t pid = fork();
  if (pid < 0)
    return -1;
  if (pid == 0) {
#ifdef __linux__
    /* The daemon dies with its test: a test that stops at a failed REQUIRE
     * never stops its daemon, which would hold the test's stdout open and
     * make ctest wait out the whole timeout. */
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != test_pid)
      _exit(127);
#endif
    int fd = open(d->log, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      dup2(fd, 2);
      close(fd);
    }
    setenv("NOTIFY_SOCKET", d->notify, 1);
    execv(argv[0], (char *const *)argv);
    _exit(127);
  }
  d->pid = pid;
  uint64_t deadline = tc_now_ms() + 30000;
  while (tc_now_ms() < deadline) {
    struct pollfd p = {.fd = d->notify_fd, .events = POLLIN};
    if (poll(&p, 1, 100) > 0) {
      char buf[512];
      ssize_t r = recv(d->notify_fd, buf, sizeof buf - 1, 0);
      if (r > 0) {
        buf[r] = 0;
        if (strstr(buf, "READY=1"))
          return 0;
      }
    }
    int st;
    if (waitpid(pid, &st, WNOHANG) == pid) {
      d->pid = 0;
      return -1;
    }
  }
  return -1;
}

static TC_UNUSED int tc_daemon_stop(tc_daemon_t *d) {
  if (d->pid <= 0)
    return -1;
  kill(d->pid, SIGTERM);
  uint64_t deadline = tc_now_ms() + 30000;
  int st = 0;
  while (tc_now_ms() < deadline) {
    pid_t r = waitpid(d->pid, &st, WNOHANG);
    if (r == d->pid) {
      d->pid = 0;
      return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    }
    usleep(10000);
  }
  kill(d->pid, SIGKILL);
  waitpid(d->pid, &st, 0);
  d->pid = 0;
  return -1;
}

static TC_UNUSED void tc_daemon_kill9(tc_daemon_t *d) {
  if (d->pid <= 0)
    return;
  kill(d->pid, SIGKILL);
  int st;
  waitpid(d->pid, &st, 0);
  d->pid = 0;
}

static TC_UNUSED void tc_daemon_cleanup(tc_daemon_t *d) {
  if (d->pid > 0)
    tc_daemon_kill9(d);
  if (d->notify_fd >= 0)
    close(d->notify_fd);
  d->notify_fd = -1;
  if (getenv("CAP_KEEP_TMP"))
    return;
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", d->dir);
  if (strncmp(d->dir, "/tmp/capd-test-", 15) == 0 && system(cmd) != 0)
    fprintf(stderr, "cannot remove %s\n", d->dir);
}

static TC_UNUSED int tc_daemon_finish(tc_daemon_t *d, bool failed) {
  int st = tc_daemon_stop(d);
  if (!failed)
    tc_daemon_cleanup(d);
  else
    fprintf(stderr, "log: %s\n", d->log);
  return st;
}

static TC_UNUSED bool tc_daemon_log_contains(const tc_daemon_t *d,
                                             const char *needle) {
  FILE *f = fopen(d->log, "r");
  if (!f)
    return false;
  char line[4096];
  bool found = false;
  while (!found && fgets(line, sizeof line, f))
    found = strstr(line, needle) != NULL;
  fclose(f);
  return found;
}

static TC_UNUSED int tc_run_capture(const char *const *argv, char *out,
                                    size_t out_len) {
  int pfd[2];
  if (pipe(pfd) != 0)
    return -1;
  pid_t pid = fork();
  if (pid == 0) {
    dup2(pfd[1], 1);
    dup2(pfd[1], 2);
    close(pfd[0]);
    close(pfd[1]);
    execv(argv[0], (char *const *)argv);
    _exit(127);
  }
  close(pfd[1]);
  size_t used = 0;
  for (;;) {
    char buf[4096];
    ssize_t r = read(pfd[0], buf, sizeof buf);
    if (r <= 0)
      break;
    size_t take = (size_t)r;
    if (out && used + take >= out_len)
      take = out_len > used + 1 ? out_len - used - 1 : 0;
    if (out && take) {
      memcpy(out + used, buf, take);
      used += take;
    }
  }
  if (out && out_len)
    out[used] = 0;
  close(pfd[0]);
  int st = 0;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static TC_UNUSED int tc_connect(tc_t *c, const char *sock) {
  memset(c, 0, sizeof *c);
  c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (c->fd < 0)
    return -1;
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  snprintf(sa.sun_path, sizeof sa.sun_path, "%.100s", sock);
  if (connect(c->fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
    close(c->fd);
    c->fd = -1;
    return -1;
  }
  c->dec = cap_frame_decoder_create(NULL);
  return c->dec ? 0 : -1;
}

static TC_UNUSED void tc_close(tc_t *c) {
  if (c->fd >= 0)
    close(c->fd);
  c->fd = -1;
  cap_frame_decoder_destroy(c->dec);
  c->dec = NULL;
}

static TC_UNUSED int tc_send_raw(tc_t *c, const void *buf, size_t len) {
  const uint8_t *p = buf;
  while (len) {
    ssize_t w = send(c->fd, p, len, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR)
        continue;
      return -1;
    }
    p += w;
    len -= (size_t)w;
  }
  return 0;
}

static TC_UNUSED int tc_send(tc_t *c, const Capuchin__Envelope *env) {
  uint8_t *buf = NULL;
  size_t len = 0;
  int rc = cap_frame_encode_alloc(env, 0, &buf, &len);
  if (rc)
    return rc;
  rc = tc_send_raw(c, buf, len);
  free(buf);
  return rc;
}

static TC_UNUSED int tc_send_msg(tc_t *c, void *msg) {
  Capuchin__Envelope env = CAPUCHIN__ENVELOPE__INIT;
  if (cap_proto_envelope_set(&env, msg) != 0)
    return -1;
  return tc_send(c, &env);
}

static TC_UNUSED Capuchin__Envelope *tc_recv(tc_t *c, int timeout_ms) {
  uint64_t deadline = tc_now_ms() + (uint64_t)timeout_ms;
  for (;;) {
    Capuchin__Envelope *env = NULL;
    char err[256];
    int rc = cap_frame_decoder_next(c->dec, &env, err, sizeof err);
    if (rc == 1) {
      if (env->msg_case == CAPUCHIN__ENVELOPE__MSG_ERROR) {
        c->last_error_code = env->error->code;
        snprintf(c->last_error, sizeof c->last_error, "%s",
                 env->error->message ? env->error->message : "");
      }
      return env;
    }
    if (rc < 0) {
      fprintf(stderr, "testclient: bad frame from daemon: %s\n", err);
      c->eof = true;
      return NULL;
    }
    if (c->eof)
      return NULL;
    uint64_t now = tc_now_ms();
    if (now >= deadline)
      return NULL;
    struct pollfd p = {.fd = c->fd, .events = POLLIN};
    int pr = poll(&p, 1, (int)(deadline - now));
    if (pr <= 0)
      continue;
    char buf[65536];
    ssize_t r = recv(c->fd, buf, sizeof buf, 0);
    if (r <= 0) {
      c->eof = true;
      continue;
    }
    if (cap_frame_decoder_feed(c->dec, buf, (size_t)r) != 0) {
      c->eof = true;
      return NULL;
    }
  }
}

static TC_UNUSED void tc_release(tc_t *c, Capuchin__Envelope *env) {
  cap_frame_decoder_release(c->dec, env);
}

static TC_UNUSED Capuchin__Envelope *tc_wait(tc_t *c, int msg_case,
                                             int timeout_ms) {
  uint64_t deadline = tc_now_ms() + (uint64_t)timeout_ms;
  for (;;) {
    uint64_t now = tc_now_ms();
    if (now >= deadline)
      return NULL;
    Capuchin__Envelope *env = tc_recv(c, (int)(deadline - now));
    if (!env)
      return NULL;
    if ((int)env->msg_case == msg_case)
      return env;
    tc_release(c, env);
  }
}

static TC_UNUSED bool tc_wait_closed(tc_t *c, int timeout_ms) {
  uint64_t deadline = tc_now_ms() + (uint64_t)timeout_ms;
  while (!c->eof && tc_now_ms() < deadline) {
    Capuchin__Envelope *env = tc_recv(c, 100);
    if (env)
      tc_release(c, env);
  }
  return c->eof;
}

static TC_UNUSED int tc_send_hello(tc_t *c, const tc_hello_args_t *a) {
  Capuchin__Hello h = CAPUCHIN__HELLO__INIT;
  h.has_protocol_version = h.has_pid = h.has_device_index = 1;
  h.has_device_total_bytes = h.has_budget_bytes = 1;
  h.has_h2d_gbps = h.has_d2h_gbps = h.has_duplex_gbps = 1;
  h.protocol_version = CAP_PROTO_VERSION;
  h.job_name = (char *)a->job;
  h.pid = (uint32_t)getpid();
  h.device_index = a->device_index;
  h.device_name = "sim";
  h.device_total_bytes =
      a->device_total_bytes ? a->device_total_bytes : (80ull << 30);
  h.budget_bytes = a->budget_bytes;
  h.h2d_gbps = 55.1;
  h.d2h_gbps = 55.1;
  h.duplex_gbps = 85.8;
  h.backend = "sim";
  if (a->signature) {
    h.has_model_signature = 1;
    h.model_signature = a->signature;
  }
  if (a->persistent_bytes) {
    h.has_persistent_bytes = 1;
    h.persistent_bytes = a->persistent_bytes;
  }
  h.device_uuid = (char *)a->device_uuid;
  h.has_acks_budget = h.acks_budget = a->acks_budget;
  return tc_send_msg(c, &h);
}

static TC_UNUSED int tc_wait_welcome(tc_t *c, tc_welcome_t *w,
                                     int timeout_ms) {
  Capuchin__Envelope *env =
      tc_wait(c, CAPUCHIN__ENVELOPE__MSG_WELCOME, timeout_ms);
  if (!env)
    return -1;
  if (w) {
    w->session_id = env->welcome->session_id;
    w->job_id = env->welcome->job_id;
    w->budget_bytes = env->welcome->budget_bytes;
    w->plan_reused = env->welcome->plan_reused;
    w->wants_budget_ack = env->welcome->wants_budget_ack;
  }
  tc_release(c, env);
  return 0;
}

static TC_UNUSED int tc_hello(tc_t *c, const tc_hello_args_t *a,
                              tc_welcome_t *w, int timeout_ms) {
  /* A refused peer may find the connection closed before its Hello is
   * written; the daemon's Error frame is still there to read. */
  bool sent = tc_send_hello(c, a) == 0;
  return tc_wait_welcome(c, w, sent ? timeout_ms : 2000);
}

static TC_UNUSED int tc_flush_batch(tc_t *c, cap_proto_batch_t *b) {
  uint8_t *buf = NULL;
  size_t len = 0, cap = 0;
  int rc = cap_proto_batch_append_frame(b, 0, &buf, &len, &cap);
  if (rc == 0)
    rc = tc_send_raw(c, buf, len);
  free(buf);
  return rc;
}

static TC_UNUSED int tc_send_iteration_end(tc_t *c, uint64_t iteration,
                                           int64_t iter_ns, bool measured,
                                           bool incomplete,
                                           uint32_t plan_version,
                                           int64_t stall_ns) {
  Capuchin__IterationEnd e = CAPUCHIN__ITERATION_END__INIT;
  e.has_iteration = e.has_iter_ns = e.has_peak_bytes = e.has_bytes_out = 1;
  e.has_bytes_in = e.has_stall_ns = e.has_measured = e.has_incomplete = 1;
  e.has_mode = 1;
  e.iteration = iteration;
  e.iter_ns = iter_ns;
  e.peak_bytes = 1;
  e.stall_ns = stall_ns;
  e.measured = measured;
  e.incomplete = incomplete;
  e.mode = measured ? CAPUCHIN__MODE__MODE_MEASURED : CAPUCHIN__MODE__MODE_GUIDED;
  if (plan_version) {
    e.has_plan_version = 1;
    e.plan_version = plan_version;
  }
  return tc_send_msg(c, &e);
}

static TC_UNUSED int tc_send_iteration(tc_t *c, const cap_profile_t *p,
                                       uint64_t iteration, bool declare,
                                       uint32_t batch_ops) {
  cap_proto_batch_t *b = cap_proto_batch_create();
  if (!b)
    return -1;
  int rc = 0;
  cap_proto_batch_reset(b, iteration);
  if (declare)
    for (uint32_t t = 0; t < p->n_tensors && !rc; t++)
      rc = cap_proto_batch_add_decl(b, t, p->tensors[t].bytes,
                                    p->tensors[t].kind);
  uint32_t in_batch = 0;
  for (uint32_t i = 0; i < p->n_ops && !rc; i++) {
    const cap_op_t *op = &p->ops[i];
    rc = cap_proto_batch_add_op(b, i, op->start_ns, op->end_ns, op->name,
                                cap_op_inputs(p, op), op->n_in,
                                cap_op_outputs(p, op), op->n_out);
    if (!rc && ++in_batch >= batch_ops) {
      rc = tc_flush_batch(c, b);
      cap_proto_batch_reset(b, iteration);
      in_batch = 0;
    }
  }
  for (uint32_t i = 0; i < p->n_frees && !rc; i++)
    rc = cap_proto_batch_add_free(b, p->frees[i].t_ns, p->frees[i].tensor);
  if (!rc && cap_proto_batch_records(b))
    rc = tc_flush_batch(c, b);
  cap_proto_batch_destroy(b);
  if (rc)
    return rc;
  return tc_send_iteration_end(c, iteration, p->iter_ns, true, false, 0, 0);
}

static TC_UNUSED cap_plan_t *tc_wait_plan(tc_t *c, int timeout_ms) {
  Capuchin__Envelope *env = tc_wait(c, CAPUCHIN__ENVELOPE__MSG_PLAN,
                                    timeout_ms);
  if (!env)
    return NULL;
  cap_plan_t *plan = NULL;
  char err[256];
  if (cap_proto_plan_from_msg(env->plan, NULL, &plan, err, sizeof err) != 0)
    fprintf(stderr, "testclient: bad plan: %s\n", err);
  tc_release(c, env);
  return plan;
}

static TC_UNUSED void tc_flood_iteration_ends(const char *sock, const char *job,
                                              uint32_t n_frames) {
  tc_t c;
  tc_welcome_t w;
  tc_hello_args_t ha = {.job = job, .budget_bytes = 1u << 30};
  if (tc_connect(&c, sock) != 0 || tc_hello(&c, &ha, &w, 20000) != 0)
    _exit(2);
  size_t cap = (size_t)n_frames * 48, len = 0;
  uint8_t *buf = malloc(cap);
  for (uint32_t i = 1; i <= n_frames; i++) {
    Capuchin__IterationEnd e = CAPUCHIN__ITERATION_END__INIT;
    e.has_iteration = e.has_iter_ns = e.has_peak_bytes = e.has_bytes_out =
        e.has_bytes_in = e.has_stall_ns = e.has_measured = e.has_incomplete =
            e.has_mode = 1;
    e.iteration = i;
    e.iter_ns = 1000;
    e.mode = CAPUCHIN__MODE__MODE_PASSIVE;
    Capuchin__Envelope env = CAPUCHIN__ENVELOPE__INIT;
    cap_proto_envelope_set(&env, &e);
    uint8_t *f = NULL;
    size_t n = 0;
    if (cap_frame_encode_alloc(&env, 0, &f, &n) != 0 || len + n > cap)
      _exit(3);
    memcpy(buf + len, f, n);
    len += n;
    free(f);
  }
  if (tc_send_raw(&c, buf, len) != 0)
    _exit(4);
  Capuchin__Bye bye = CAPUCHIN__BYE__INIT;
  tc_send_msg(&c, &bye);
  tc_wait_closed(&c, 600000);
  _exit(0);
}

static TC_UNUSED bool tc_session_answers(tc_t *c) {
  Capuchin__PlanAck m = CAPUCHIN__PLAN_ACK__INIT;
  m.has_version = 1;
  m.version = 5;
  if (tc_send_msg(c, &m) != 0)
    return false;
  Capuchin__Envelope *env = tc_wait(c, CAPUCHIN__ENVELOPE__MSG_ERROR, 20000);
  if (env)
    tc_release(c, env);
  return env && strstr(c->last_error, "was never sent");
}
