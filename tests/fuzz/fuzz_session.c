/*
 * libFuzzer driver: arbitrary byte streams fed into a capuchind session's
 * input path, with no socket in between (the session is transport-
 * independent): framing, validation, the state machine, the tracker, the
 * off-loop Hello/planning/store work (run to completion on a private loop and
 * a temporary database) and the session's close. The daemon must never crash,
 * leak or hang, whatever the bytes.
 *
 * The first input byte picks how the rest is split into reads (1..256 bytes
 * or all at once) so that partial frames are exercised too.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon_internal.h"

typedef struct fake {
  bool closed;
  size_t frames_out;
} fake_t;

static int fake_send(void *ctx, uint8_t *frame, size_t len) {
  fake_t *f = ctx;
  free(frame);
  f->frames_out++;
  return 0;
}

static void fake_close(void *ctx) { ((fake_t *)ctx)->closed = true; }

static const cap__session_io_t fake_io = {.send = fake_send,
                                          .close = fake_close};

static cap_daemon_t daemon_ctx;
static uv_loop_t loop;
static char db_path[64];

static void cleanup(void) {
  cap__daemon_close_core(&daemon_ctx);
  uv_loop_close(&loop);
  char p[96];
  unlink(db_path);
  snprintf(p, sizeof p, "%s-wal", db_path);
  unlink(p);
  snprintf(p, sizeof p, "%s-shm", db_path);
  unlink(p);
}

static int setup(void) {
  cap_daemon_config_t cfg;
  cap_daemon_config_init(&cfg);
  snprintf(db_path, sizeof db_path, "/tmp/capd-fuzz-%ld.db", (long)getpid());
  snprintf(cfg.db_path, sizeof cfg.db_path, "%s", db_path);
  /* Small quotas so that the fuzzer reaches them. */
  cfg.max_frame_bytes = 1u << 20;
  cfg.max_accesses_per_iteration = 1u << 16;
  cfg.max_ops_per_iteration = 1u << 14;
  cfg.max_tensors = 1u << 14;
  cap__log_set_level(getenv("CAP_FUZZ_LOG") ? CAP_LOG_DEBUG : CAP_LOG_ERROR);
  if (uv_loop_init(&loop) != 0)
    return -1;
  char err[512];
  if (cap__daemon_init_core(&daemon_ctx, &loop, &cfg, err, sizeof err) != 0) {
    fprintf(stderr, "fuzz_session: %s\n", err);
    return -1;
  }
  atexit(cleanup);
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static int ready = 0;
  if (!ready) {
    if (setup() != 0)
      abort();
    ready = 1;
  }
  if (size == 0)
    return 0;
  size_t chunk = data[0] == 0 ? size : data[0];
  data++;
  size--;
  fake_t f = {0};
  cap__session_t *s =
      cap__session_create(&daemon_ctx, &fake_io, &f, 4242, 0, 0);
  if (!s)
    return 0;
  for (size_t off = 0; off < size && !f.closed; off += chunk) {
    size_t n = size - off < chunk ? size - off : chunk;
    cap__session_feed(s, data + off, n);
    /* Let off-loop work (Hello, planning, store writes) finish between
     * reads, as it would on a real loop. */
    uv_run(&loop, UV_RUN_NOWAIT);
  }
  uv_run(&loop, UV_RUN_DEFAULT);
  /* The transport goes away (as the close callback would report). */
  cap__session_detach(s);
  uv_run(&loop, UV_RUN_DEFAULT);
  if (daemon_ctx.sessions != NULL)
    abort(); /* a session outlived its transport and its tasks */
  return 0;
}
