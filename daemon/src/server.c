/*
 * The listening socket and the connections: accept, authorise by
 * SO_PEERCRED, move bytes between the socket and the session, bound what a
 * peer may leave unsent, handle signals (SIGTERM/SIGINT stop, SIGHUP reloads
 * the config and reopens the log) and tell systemd when ready.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* struct ucred, SO_PEERCRED */
#endif
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "daemon_internal.h"

typedef struct conn {
  uv_pipe_t pipe;
  cap_daemon_t *d;
  cap__session_t *s; /* NULL for a refused peer */
  size_t pending;    /* bytes queued for writing */
  bool closing;
  bool reading;
  bool paused;    /* by the session (Hello in flight) */
  bool throttled; /* read its share this loop turn; resumed next turn */
  size_t turn_bytes;
  uint64_t turn_no; /* the turn turn_bytes counts */
  struct conn *next_throttled;
  char buf[64 * 1024];
} conn_t;

/* Bytes one connection may feed per loop turn before yielding to the others
 * (libuv would otherwise read up to 32 buffers per wakeup): bounds the loop
 * stall a fast client can cause, as redis caps work per event. */
#define TURN_BYTES (128u * 1024u)
/* And all connections together: what keeps a timer's lateness bounded with
 * many busy clients (32 clients x 64 KiB reads would be ~40 ms of work). */
#define TURN_BYTES_ALL (256u * 1024u)

typedef struct write_req {
  uv_write_t req;
  conn_t *c;
  uint8_t *data;
  size_t len;
} write_req_t;

static void on_conn_close(uv_handle_t *h) {
  conn_t *c = h->data;
  if (c->throttled) {
    conn_t **pp = (conn_t **)&c->d->throttled;
    while (*pp && *pp != c)
      pp = &(*pp)->next_throttled;
    if (*pp)
      *pp = c->next_throttled;
  }
  if (c->s)
    cap__session_detach(c->s);
  free(c);
}

static void conn_close(conn_t *c) {
  if (c->closing)
    return;
  c->closing = true;
  /* Let queued writes (an Error frame) go out before closing: uv_close would
   * cancel them, so shut the write side down first when possible. */
  uv_close((uv_handle_t *)&c->pipe, on_conn_close);
}

static void on_write(uv_write_t *req, int status) {
  write_req_t *w = (write_req_t *)req;
  w->c->pending -= w->len;
  free(w->data);
  free(w);
}

typedef struct shutdown_req {
  uv_shutdown_t req;
  conn_t *c;
} shutdown_req_t;

static void on_shutdown(uv_shutdown_t *req, int status) {
  shutdown_req_t *r = (shutdown_req_t *)req;
  conn_close(r->c);
  free(r);
}

/* --- Session transport ------------------------------------------------------ */

static int io_send(void *ctx, uint8_t *frame, size_t len) {
  conn_t *c = ctx;
  if (c->closing) {
    free(frame);
    return CAP_ENOTCONN;
  }
  if (c->pending + len > c->d->cfg.max_pending_write_bytes) {
    free(frame);
    return CAP_EQUOTA;
  }
  write_req_t *w = malloc(sizeof *w);
  if (!w) {
    free(frame);
    return CAP_ENOMEM;
  }
  w->c = c;
  w->data = frame;
  w->len = len;
  uv_buf_t b = uv_buf_init((char *)frame, (unsigned)len);
  int rc = uv_write(&w->req, (uv_stream_t *)&c->pipe, &b, 1, on_write);
  if (rc != 0) {
    free(frame);
    free(w);
    return CAP_EIO;
  }
  c->pending += len;
  return 0;
}

static void io_close(void *ctx) {
  conn_t *c = ctx;
  if (c->closing)
    return;
  if (c->reading) {
    uv_read_stop((uv_stream_t *)&c->pipe);
    c->reading = false;
  }
  /* Flush what was queued (an Error frame, a Bye), then close. */
  shutdown_req_t *r = malloc(sizeof *r);
  if (r) {
    r->c = c;
    if (uv_shutdown(&r->req, (uv_stream_t *)&c->pipe, on_shutdown) == 0)
      return;
    free(r);
  }
  conn_close(c);
}

static void throttle(conn_t *c) {
  if (c->reading && !c->closing) {
    uv_read_stop((uv_stream_t *)&c->pipe);
    c->reading = false;
  }
  if (!c->throttled) {
    c->throttled = true;
    c->next_throttled = c->d->throttled;
    c->d->throttled = c;
  }
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  conn_t *c = h->data;
  if (c->turn_no != c->d->turn_no) {
    c->turn_no = c->d->turn_no;
    c->turn_bytes = 0;
  }
  /* Over this turn's share: no buffer (UV_ENOBUFS), read it next turn. */
  if (c->turn_bytes >= TURN_BYTES || c->d->turn_bytes >= TURN_BYTES_ALL)
    *buf = uv_buf_init(NULL, 0);
  else
    *buf = uv_buf_init(c->buf, sizeof c->buf);
}

static void on_read(uv_stream_t *st, ssize_t n, const uv_buf_t *buf) {
  conn_t *c = st->data;
  if (n == UV_ENOBUFS) {
    throttle(c);
    return;
  }
  if (n > 0) {
    c->turn_bytes += (size_t)n;
    c->d->turn_bytes += (size_t)n;
    cap__session_feed(c->s, buf->base, (size_t)n);
    return;
  }
  if (n < 0) {
    if (c->reading) {
      uv_read_stop(st);
      c->reading = false;
    }
    conn_close(c);
  }
}

static void io_pause(void *ctx) {
  conn_t *c = ctx;
  c->paused = true;
  if (c->reading && !c->closing) {
    uv_read_stop((uv_stream_t *)&c->pipe);
    c->reading = false;
  }
}

static void io_resume(void *ctx) {
  conn_t *c = ctx;
  c->paused = false;
  if (!c->reading && !c->closing && !c->throttled &&
      uv_read_start((uv_stream_t *)&c->pipe, on_alloc, on_read) == 0)
    c->reading = true;
}

static const cap__session_io_t conn_io = {
    .send = io_send, .close = io_close, .pause = io_pause,
    .resume = io_resume,
};

static void on_turn(uv_prepare_t *h) {
  cap_daemon_t *d = h->data;
  conn_t *c = d->throttled;
  d->throttled = NULL;
  d->turn_no++;
  d->turn_bytes = 0;
  while (c) {
    conn_t *next = c->next_throttled;
    c->throttled = false;
    c->next_throttled = NULL;
    c->turn_bytes = 0;
    if (!c->paused)
      io_resume(c);
    c = next;
  }
}

/* --- Accept and authorise ----------------------------------------------------- */

static bool authorised(const cap_daemon_t *d, uid_t uid, gid_t gid) {
  if (uid == 0 || uid == geteuid())
    return true;
  for (uint32_t i = 0; i < d->cfg.n_allow_uids; i++)
    if (d->cfg.allow_uids[i] == uid)
      return true;
  for (uint32_t i = 0; i < d->cfg.n_allow_gids; i++)
    if (d->cfg.allow_gids[i] == gid)
      return true;
  return false;
}

static void refuse(conn_t *c, int code, const char *msg) {
  uint8_t *buf = NULL;
  size_t len = 0;
  if (cap_proto_error_frame(code, msg, &buf, &len) == 0)
    io_send(c, buf, len);
  io_close(c);
}

/* Descriptors kept free below the fd limit for the store (database, -wal,
 * -shm, a journal), the log being reopened and libuv: past it new
 * connections are refused with an Error. At the limit itself accept()
 * fails, and libuv then accepts and closes the connection with its spare
 * descriptor, unseen by us: the client would get a bare EOF and the log
 * nothing. */
#define FD_RESERVE 16

static void on_connection(uv_stream_t *server, int status) {
  cap_daemon_t *d = server->data;
  if (status < 0) {
    cap__log(CAP_LOG_WARN, "accept: %s", uv_strerror(status));
    return;
  }
  conn_t *c = calloc(1, sizeof *c);
  if (!c)
    return;
  c->d = d;
  uv_pipe_init(d->loop, &c->pipe, 0);
  c->pipe.data = c;
  if (uv_accept(server, (uv_stream_t *)&c->pipe) != 0) {
    conn_close(c);
    return;
  }
  uv_os_fd_t fd;
  struct ucred cred;
  socklen_t clen = sizeof cred;
  if (uv_fileno((uv_handle_t *)&c->pipe, &fd) != 0 ||
      getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) != 0) {
    cap__log(CAP_LOG_WARN, "connection refused: no peer credentials: %s",
             strerror(errno));
    d->stats.sessions_refused++;
    refuse(c, CAP_EPERM, "peer credentials unavailable");
    return;
  }
  if (!authorised(d, cred.uid, cred.gid)) {
    char msg[160];
    snprintf(msg, sizeof msg,
             "uid %u gid %u is not allowed to use this daemon (--allow-uid, "
             "--allow-gid)",
             (unsigned)cred.uid, (unsigned)cred.gid);
    cap__log(CAP_LOG_WARN, "connection from pid %d refused: %s",
             (int)cred.pid, msg);
    d->stats.sessions_refused++;
    refuse(c, CAP_EPERM, msg);
    return;
  }
  if (d->fd_limit > 0 && (int)fd >= d->fd_limit - FD_RESERVE) {
    char msg[160];
    snprintf(msg, sizeof msg,
             "too many open files (descriptor %d of a limit of %d; raise "
             "LimitNOFILE / ulimit -n, or lower max-sessions)",
             (int)fd, d->fd_limit);
    cap__log(CAP_LOG_WARN, "connection from pid %d uid %u refused: %s",
             (int)cred.pid, (unsigned)cred.uid, msg);
    d->stats.sessions_refused++;
    refuse(c, CAP_EQUOTA, msg);
    return;
  }
  if (d->n_live >= d->cfg.max_sessions || d->stopping) {
    char msg[128];
    snprintf(msg, sizeof msg, "%s (max-sessions %" PRIu32 ")",
             d->stopping ? "daemon is stopping" : "too many sessions",
             d->cfg.max_sessions);
    cap__log(CAP_LOG_WARN, "connection from pid %d uid %u refused: %s",
             (int)cred.pid, (unsigned)cred.uid, msg);
    d->stats.sessions_refused++;
    refuse(c, CAP_EQUOTA, msg);
    return;
  }
  c->s = cap__session_create(d, &conn_io, c, (uint32_t)cred.pid,
                             (uint32_t)cred.uid, (uint32_t)cred.gid);
  if (!c->s) {
    refuse(c, CAP_ENOMEM, "out of memory");
    return;
  }
  d->stats.sessions_accepted++;
  cap__log(CAP_LOG_DEBUG, "session %" PRIu64 ": connected, pid %d uid %u",
           c->s->local_id, (int)cred.pid, (unsigned)cred.uid);
  io_resume(c);
}

/* --- Core (store, state) without sockets ------------------------------------ */

int cap__daemon_init_core(cap_daemon_t *d, uv_loop_t *loop,
                          const cap_daemon_config_t *cfg, char *err,
                          size_t err_len) {
  d->loop = loop;
  d->cfg = *cfg;
  struct stat st;
  bool was_open_to_all = stat(cfg->db_path, &st) == 0 && (st.st_mode & 0007);
  int rc = cap_store_open_mode(cfg->db_path, CAP_STORE_CREATE, cfg->db_mode,
                               &d->store);
  if (rc != 0) {
    snprintf(err, err_len, "%s", cap_store_last_error());
    if (!err[0])
      snprintf(err, err_len, "%s: %s", cfg->db_path, cap_strerror(rc));
    return rc;
  }
  if (was_open_to_all)
    cap__log(CAP_LOG_WARN,
             "%s was readable by every local user (mode %04o); other users' "
             "access removed",
             cfg->db_path, (unsigned)(st.st_mode & 0777));
  return 0;
}

void cap__daemon_close_core(cap_daemon_t *d) {
  cap__store_queue_drop(d);
  cap_store_close(d->store);
  d->store = NULL;
}

/* --- Signals, stop, reload ------------------------------------------------- */

static void close_cb_noop(uv_handle_t *h) {}

static void begin_stop(cap_daemon_t *d) {
  if (d->stopping)
    return;
  d->stopping = true;
  cap__notify("STOPPING=1");
  cap__log(CAP_LOG_INFO, "stopping: closing %" PRIu32 " sessions",
           d->n_live);
  if (d->listening) {
    uv_close((uv_handle_t *)&d->server, close_cb_noop);
    d->listening = false;
    if (!d->socket_inherited) /* systemd removes its own */
      unlink(d->cfg.socket_path);
  }
  for (cap__session_t *s = d->sessions; s; s = s->next) {
    if (s->state == CAP__S_CLOSING)
      continue;
    Capuchin__Bye bye = CAPUCHIN__BYE__INIT;
    bye.reason = "daemon stopping";
    Capuchin__Envelope env = CAPUCHIN__ENVELOPE__INIT;
    cap_proto_envelope_set(&env, &bye);
    cap__session_send_env(s, &env);
    if (s->io_ctx)
      s->io->close(s->io_ctx);
  }
  if (d->signals) {
    uv_close((uv_handle_t *)&d->sig_term, close_cb_noop);
    uv_close((uv_handle_t *)&d->sig_int, close_cb_noop);
    uv_close((uv_handle_t *)&d->sig_hup, close_cb_noop);
    d->signals = false;
  }
  if (d->probing) {
    uv_close((uv_handle_t *)&d->probe, close_cb_noop);
    d->probing = false;
  }
  if (d->sweeping) {
    uv_close((uv_handle_t *)&d->sweep, close_cb_noop);
    d->sweeping = false;
  }
  if (d->turn_init) {
    uv_close((uv_handle_t *)&d->turn, close_cb_noop);
    d->turn_init = false;
  }
  if (d->stop_async_init) {
    uv_close((uv_handle_t *)&d->stop_async, close_cb_noop);
    d->stop_async_init = false;
  }
  /* The loop runs on until the store tasks already queued have finished and
   * every handle is closed: in-flight writes complete. */
}

static void reload(cap_daemon_t *d) {
  cap__notify("RELOADING=1");
  cap_daemon_config_t n;
  cap_daemon_config_init(&n);
  char err[1024] = "";
  int rc = 0;
  if (d->cfg.config_path[0])
    rc = cap_daemon_config_load(&n, d->cfg.config_path, err, sizeof err);
  if (rc != 0) {
    cap__log(CAP_LOG_ERROR, "SIGHUP: config not reloaded: %s", err);
  } else {
    if (d->have_cmdline) {
      /* Options given on the command line win over the file. */
      const cap_daemon_config_t *c = &d->cmdline;
      cap_daemon_config_t base;
      cap_daemon_config_init(&base);
      if (c->gpu_memory_bytes)
        n.gpu_memory_bytes = c->gpu_memory_bytes;
      for (int i = 0; i < CAP_DAEMON_MAX_DEVICES; i++)
        if (c->gpu_memory_dev[i])
          n.gpu_memory_dev[i] = c->gpu_memory_dev[i];
      for (uint32_t i = 0; i < c->n_allow_uids; i++) {
        char v[16];
        snprintf(v, sizeof v, "%u", c->allow_uids[i]);
        cap_daemon_config_set(&n, "allow-uid", v, err, sizeof err);
      }
      for (uint32_t i = 0; i < c->n_allow_gids; i++) {
        char v[16];
        snprintf(v, sizeof v, "%u", c->allow_gids[i]);
        cap_daemon_config_set(&n, "allow-gid", v, err, sizeof err);
      }
      if (c->log_level != base.log_level)
        n.log_level = c->log_level;
      if (c->max_sessions != base.max_sessions)
        n.max_sessions = c->max_sessions;
      if (c->log_file[0])
        memcpy(n.log_file, c->log_file, sizeof n.log_file);
    }
    if (strcmp(n.socket_path, d->cfg.socket_path) != 0 &&
        strcmp(n.socket_path, "") != 0 && d->have_cmdline &&
        strcmp(d->cmdline.socket_path, d->cfg.socket_path) != 0)
      cap__log(CAP_LOG_WARN, "SIGHUP: socket and db changes need a restart");
    /* What can change at run time. */
    bool budget_changed =
        n.gpu_memory_bytes != d->cfg.gpu_memory_bytes ||
        memcmp(n.gpu_memory_dev, d->cfg.gpu_memory_dev,
               sizeof n.gpu_memory_dev) != 0;
    d->cfg.gpu_memory_bytes = n.gpu_memory_bytes;
    memcpy(d->cfg.gpu_memory_dev, n.gpu_memory_dev, sizeof n.gpu_memory_dev);
    memcpy(d->cfg.allow_uids, n.allow_uids, sizeof n.allow_uids);
    d->cfg.n_allow_uids = n.n_allow_uids;
    memcpy(d->cfg.allow_gids, n.allow_gids, sizeof n.allow_gids);
    d->cfg.n_allow_gids = n.n_allow_gids;
    d->cfg.log_level = n.log_level;
    d->cfg.max_sessions = n.max_sessions;
    d->cfg.bw_tolerance = n.bw_tolerance;
    memcpy(d->cfg.log_file, n.log_file, sizeof n.log_file);
    cap__log_set_level(n.log_level);
    /* Reopen before saying anything, so the news lands in the new file. */
    if (cap__log_open(d->cfg.log_file) != 0)
      cap__log(CAP_LOG_ERROR, "SIGHUP: cannot open log file %s: %s",
               d->cfg.log_file, strerror(errno));
    cap__log(CAP_LOG_INFO,
             "SIGHUP: config reloaded (%" PRIu32 " allowed uids, %" PRIu32
             " allowed gids, gpu-memory %" PRIu64 ", log level %d)",
             d->cfg.n_allow_uids, d->cfg.n_allow_gids, d->cfg.gpu_memory_bytes,
             (int)d->cfg.log_level);
    if (budget_changed)
      for (cap__session_t *s = d->sessions; s; s = s->next)
        if (s->state == CAP__S_ACTIVE)
          cap__daemon_rebalance(d, s);
  }
  if (rc != 0 && cap__log_open(d->cfg.log_file) != 0) /* reopen anyway */
    cap__log(CAP_LOG_ERROR, "SIGHUP: cannot open log file %s: %s",
             d->cfg.log_file, strerror(errno));
  cap__notify("READY=1");
}

static void on_signal(uv_signal_t *h, int signum) {
  cap_daemon_t *d = h->data;
  if (signum == SIGHUP) {
    cap__log(CAP_LOG_INFO, "SIGHUP: reopening the log, re-reading the config");
    reload(d);
    return;
  }
  cap__log(CAP_LOG_INFO, "%s received", signum == SIGTERM ? "SIGTERM" : "SIGINT");
  begin_stop(d);
}

static void on_stop_async(uv_async_t *h) { begin_stop(h->data); }

static void on_sweep(uv_timer_t *t) { cap__daemon_sweep(t->data); }

static void on_probe(uv_timer_t *t) {
  cap_daemon_t *d = t->data;
  uint64_t now = cap__now_ns();
  uint64_t expect = (uint64_t)d->cfg.stall_probe_ms * 1000000u;
  if (d->probe_last_ns) {
    int64_t late = (int64_t)(now - d->probe_last_ns) - (int64_t)expect;
    if (late > d->stats.max_loop_stall_ns)
      d->stats.max_loop_stall_ns = late;
  }
  d->probe_last_ns = now;
}

/* --- Public API --------------------------------------------------------------- */

static int mkdir_parent(const char *path) {
  char dir[sizeof ((struct sockaddr_un *)0)->sun_path];
  snprintf(dir, sizeof dir, "%s", path);
  char *slash = strrchr(dir, '/');
  if (!slash || slash == dir)
    return 0;
  *slash = 0;
  for (char *p = dir + 1; *p; p++) {
    if (*p != '/')
      continue;
    *p = 0;
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
      return -1;
    *p = '/';
  }
  if (mkdir(dir, 0755) != 0 && errno != EEXIST)
    return -1;
  return 0;
}

/* A socket file left by a daemon that died: remove it when nobody answers;
 * refuse to start when another daemon is listening. */
/* Socket activation (sd_listen_fds(3)'s protocol, no libsystemd): when
 * LISTEN_PID is this process and LISTEN_FDS is 1, descriptor 3 is a
 * listening Unix socket. Returns it, or -1. The variables are cleared so
 * that children do not inherit them. */
static int listen_fd_from_systemd(void) {
  const char *pid = getenv("LISTEN_PID"), *fds = getenv("LISTEN_FDS");
  if (!pid || !fds)
    return -1;
  char *end;
  long p = strtol(pid, &end, 10);
  if (*end || p != (long)getpid())
    return -1;
  long n = strtol(fds, &end, 10);
  unsetenv("LISTEN_PID");
  unsetenv("LISTEN_FDS");
  unsetenv("LISTEN_FDNAMES");
  if (*end || n != 1) {
    cap__log(CAP_LOG_WARN, "LISTEN_FDS=%s: expected exactly one socket; "
             "binding the configured path instead", fds);
    return -1;
  }
  struct sockaddr_un sa;
  socklen_t len = sizeof sa;
  int type = 0;
  socklen_t tlen = sizeof type;
  if (getsockname(3, (struct sockaddr *)&sa, &len) != 0 ||
      sa.sun_family != AF_UNIX ||
      getsockopt(3, SOL_SOCKET, SO_TYPE, &type, &tlen) != 0 ||
      type != SOCK_STREAM) {
    cap__log(CAP_LOG_WARN, "LISTEN_FDS: descriptor 3 is not a Unix stream "
             "socket; binding the configured path instead");
    return -1;
  }
  fcntl(3, F_SETFD, FD_CLOEXEC);
  cap__log(CAP_LOG_INFO, "using the socket systemd passed (%s)",
           len > sizeof(sa_family_t) && sa.sun_path[0] ? sa.sun_path
                                                      : "unnamed");
  return 3;
}

static int clear_stale_socket(const char *path, char *err, size_t err_len) {
  struct stat st;
  if (lstat(path, &st) != 0)
    return 0;
  if (!S_ISSOCK(st.st_mode)) {
    snprintf(err, err_len, "%s exists and is not a socket", path);
    return CAP_EINVAL;
  }
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd >= 0) {
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
    int rc = connect(fd, (struct sockaddr *)&sa, sizeof sa);
    close(fd);
    if (rc == 0) {
      snprintf(err, err_len, "%s: another capuchind is listening", path);
      return CAP_ESTATE;
    }
  }
  unlink(path);
  return 0;
}

int cap_daemon_create(const cap_daemon_config_t *cfg,
                      const cap_daemon_config_t *cmdline, cap_daemon_t **out,
                      char *err, size_t err_len) {
  *out = NULL;
  err[0] = 0;
  cap_daemon_t *d = calloc(1, sizeof *d);
  if (!d) {
    snprintf(err, err_len, "out of memory");
    return CAP_ENOMEM;
  }
  d->loop = malloc(sizeof *d->loop);
  if (!d->loop || uv_loop_init(d->loop) != 0) {
    free(d->loop);
    free(d);
    snprintf(err, err_len, "cannot create the event loop");
    return CAP_ENOMEM;
  }
  d->own_loop = true;
  {
    /* Every session is a descriptor: take what the hard limit allows, and
     * know the limit so that connections past it are refused in words. */
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
      if (rl.rlim_cur < rl.rlim_max) {
        struct rlimit want = rl;
        want.rlim_cur = rl.rlim_max > 1048576 ? 1048576 : rl.rlim_max;
        if (want.rlim_cur > rl.rlim_cur && setrlimit(RLIMIT_NOFILE, &want) == 0)
          rl = want;
      }
      d->fd_limit = rl.rlim_cur > INT_MAX ? INT_MAX : (int)rl.rlim_cur;
    }
  }
  if (cmdline) {
    d->cmdline = *cmdline;
    d->have_cmdline = true;
  }
  cap__log_set_level(cfg->log_level);
  if (cfg->log_file[0] && cap__log_open(cfg->log_file) != 0) {
    snprintf(err, err_len, "cannot open log file %s: %s", cfg->log_file,
             strerror(errno));
    goto out_loop;
  }
  int rc = cap__daemon_init_core(d, d->loop, cfg, err, err_len);
  if (rc != 0)
    goto out_loop_rc;
  int inherited = listen_fd_from_systemd();
  int urc;
  if (inherited >= 0) {
    /* systemd made the socket (capuchind.socket): its unit owns the path
     * and the mode, the daemon only listens on it. */
    uv_pipe_init(d->loop, &d->server, 0);
    d->server.data = d;
    d->socket_inherited = true;
    urc = uv_pipe_open(&d->server, inherited);
    if (urc == 0)
      urc = uv_listen((uv_stream_t *)&d->server, 128, on_connection);
  } else {
    if (mkdir_parent(cfg->socket_path) != 0) {
      snprintf(err, err_len, "cannot create the folder of %s: %s",
               cfg->socket_path, strerror(errno));
      rc = CAP_EIO;
      goto out_store;
    }
    if ((rc = clear_stale_socket(cfg->socket_path, err, err_len)) != 0)
      goto out_store;
    uv_pipe_init(d->loop, &d->server, 0);
    d->server.data = d;
    /* Created 0660 from the start: no window in which others may connect. */
    mode_t old = umask(0117);
    urc = uv_pipe_bind(&d->server, cfg->socket_path);
    umask(old);
    if (urc == 0)
      urc = uv_listen((uv_stream_t *)&d->server, 128, on_connection);
  }
  if (urc != 0) {
    snprintf(err, err_len, "cannot listen on %s: %s", cfg->socket_path,
             uv_strerror(urc));
    uv_close((uv_handle_t *)&d->server, NULL);
    uv_run(d->loop, UV_RUN_NOWAIT);
    rc = CAP_EIO;
    goto out_store;
  }
  if (!d->socket_inherited)
    chmod(cfg->socket_path, 0660);
  d->listening = true;
  uv_prepare_init(d->loop, &d->turn);
  d->turn.data = d;
  uv_prepare_start(&d->turn, on_turn);
  uv_unref((uv_handle_t *)&d->turn);
  d->turn_init = true;
  uv_async_init(d->loop, &d->stop_async, on_stop_async);
  d->stop_async.data = d;
  d->stop_async_init = true;
  *out = d;
  return 0;
out_store:
  cap__daemon_close_core(d);
  goto out_loop_rc;
out_loop:
  rc = CAP_EIO;
out_loop_rc:
  uv_loop_close(d->loop);
  free(d->loop);
  free(d);
  return rc;
}

int cap_daemon_run(cap_daemon_t *d, int handle_signals) {
  if (handle_signals) {
    signal(SIGPIPE, SIG_IGN);
    uv_signal_init(d->loop, &d->sig_term);
    uv_signal_init(d->loop, &d->sig_int);
    uv_signal_init(d->loop, &d->sig_hup);
    d->sig_term.data = d->sig_int.data = d->sig_hup.data = d;
    uv_signal_start(&d->sig_term, on_signal, SIGTERM);
    uv_signal_start(&d->sig_int, on_signal, SIGINT);
    uv_signal_start(&d->sig_hup, on_signal, SIGHUP);
    d->signals = true;
  }
  if (d->cfg.stall_probe_ms) {
    uv_timer_init(d->loop, &d->probe);
    d->probe.data = d;
    uv_timer_start(&d->probe, on_probe, d->cfg.stall_probe_ms,
                   d->cfg.stall_probe_ms);
    d->probing = true;
  }
  {
    /* A quarter of the shortest deadline: a session is closed (or stops
     * holding the others back) at most 25 % late, and an idle daemon wakes
     * at most once a second for it. */
    uint32_t ms = d->cfg.handshake_timeout_ms < d->cfg.idle_timeout_ms
                      ? d->cfg.handshake_timeout_ms
                      : d->cfg.idle_timeout_ms;
    if (d->cfg.budget_ack_timeout_ms < ms)
      ms = d->cfg.budget_ack_timeout_ms;
    ms /= 4;
    if (ms < 5)
      ms = 5;
    if (ms > 1000)
      ms = 1000;
    uv_timer_init(d->loop, &d->sweep);
    d->sweep.data = d;
    uv_timer_start(&d->sweep, on_sweep, ms, ms);
    uv_unref((uv_handle_t *)&d->sweep); /* the sessions keep the loop alive */
    d->sweeping = true;
  }
  cap__log(CAP_LOG_INFO,
           "listening on %s (mode 0660), database %s, max %" PRIu32
           " sessions, fd limit %d%s",
           d->cfg.socket_path, d->cfg.db_path, d->cfg.max_sessions,
           d->fd_limit,
           d->cfg.gpu_memory_bytes ? ", gpu-memory set" : "");
  char ready[128];
  snprintf(ready, sizeof ready, "READY=1\nSTATUS=listening\nMAINPID=%ld",
           (long)getpid());
  cap__notify(ready);
  int rc = uv_run(d->loop, UV_RUN_DEFAULT);
  (void)rc;
  cap__log(CAP_LOG_INFO, "stopped");
  return 0;
}

void cap_daemon_stop(cap_daemon_t *d) { uv_async_send(&d->stop_async); }

void cap_daemon_get_stats(const cap_daemon_t *d, cap_daemon_stats_t *out) {
  *out = d->stats;
}

void cap_daemon_destroy(cap_daemon_t *d) {
  if (!d)
    return;
  if (!d->stopping)
    begin_stop(d);
  uv_run(d->loop, UV_RUN_DEFAULT);
  cap__daemon_close_core(d);
  if (d->own_loop) {
    uv_loop_close(d->loop);
    free(d->loop);
  }
  free(d);
}
