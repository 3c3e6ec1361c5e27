/*
 * A test client speaking the Capuchin protocol over a real socket, and a
 * harness that starts a real capuchind (CAP_BIN_DIR/capuchind) on a
 * temporary socket and database. Until libcapuchin-client drives the daemon
 * end to end, integration tests use this to replay a trace file as a
 * measured iteration.
 *
 * Use: #include "testclient.h" in one test_*.c (every function is static;
 * the implementation is in testclient_impl.h, included from here).
 * Blocking I/O with timeouts; single-threaded per tc_t.
 */
#ifndef CAP_TESTCLIENT_H
#define CAP_TESTCLIENT_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "capuchin/frame.h"
#include "capuchin/plan.h"
#include "capuchin/profile.h"
#include "capuchin/proto.h"

typedef struct tc_daemon {
  pid_t pid;
  char dir[256];  /* temporary folder holding socket, db, log */
  char sock[320];
  char db[320];
  char log[320];
  char notify[320];
  int notify_fd;
} tc_daemon_t;

typedef struct tc {
  int fd;
  cap_frame_decoder_t *dec;
  bool eof;
  int last_error_code;    /* code of the last Error frame received */
  char last_error[512];   /* its message */
} tc_t;

typedef struct tc_welcome {
  uint64_t session_id, job_id, budget_bytes;
  bool plan_reused;
  bool wants_budget_ack;
} tc_welcome_t;

typedef struct tc_hello_args {
  const char *job;
  uint64_t budget_bytes;
  uint64_t device_total_bytes; /* 0: 80 GiB */
  uint32_t device_index;
  uint64_t signature;          /* 0: none */
  uint64_t persistent_bytes;   /* 0: none */
  const char *device_uuid;     /* NULL: none (an older client) */
  bool acks_budget;            /* confirms budget cuts (BudgetAck) */
} tc_hello_args_t;

/* Start capuchind in a new temp folder (dir NULL) or in dir (reusing its
 * db), with extra arguments (NULL-terminated, may be NULL); waits for its
 * READY=1. Returns 0, or -1 if it exited or did not get ready in 30 s. */
static int tc_daemon_start(tc_daemon_t *d, const char *dir,
                           const char *const *extra);
/* SIGTERM and wait; returns the exit status (or -1). */
static int tc_daemon_stop(tc_daemon_t *d);
static void tc_daemon_kill9(tc_daemon_t *d);
/* Run capuchind with args to completion (no READY wait); exit status, and
 * its stderr in out (truncated). */
static int tc_run_capture(const char *const *argv, char *out, size_t out_len);
static bool tc_daemon_log_contains(const tc_daemon_t *d, const char *needle);
static void tc_daemon_cleanup(tc_daemon_t *d); /* removes the temp folder */
/* Stop the daemon; then remove its folder when the test passed (failed:
 * false), or keep it and print where its log is. Returns the exit status. */
static int tc_daemon_finish(tc_daemon_t *d, bool failed);

static int tc_connect(tc_t *c, const char *sock);
static void tc_close(tc_t *c);
static int tc_send(tc_t *c, const Capuchin__Envelope *env);
static int tc_send_msg(tc_t *c, void *msg); /* any message of the oneof */
static int tc_send_raw(tc_t *c, const void *buf, size_t len);
/* Next message within timeout_ms (NULL on timeout or end of stream; c->eof
 * tells which). Release with tc_release. Error frames are recorded in
 * c->last_error*. */
static Capuchin__Envelope *tc_recv(tc_t *c, int timeout_ms);
static void tc_release(tc_t *c, Capuchin__Envelope *env);
/* Skip messages until one of msg_case arrives (NULL on timeout/eof). */
static Capuchin__Envelope *tc_wait(tc_t *c, int msg_case, int timeout_ms);
/* True when the daemon closes the connection within timeout_ms. */
static bool tc_wait_closed(tc_t *c, int timeout_ms);
static int tc_hello(tc_t *c, const tc_hello_args_t *a, tc_welcome_t *w,
                    int timeout_ms);
/* tc_hello in two halves: send the Hello; wait for the Welcome. */
static int tc_send_hello(tc_t *c, const tc_hello_args_t *a);
static int tc_wait_welcome(tc_t *c, tc_welcome_t *w, int timeout_ms);
/* Send the profile as iteration `iteration` (declarations when declare,
 * every op and free in AccessBatches of at most batch_ops ops), then an
 * IterationEnd saying measured and complete. */
static int tc_send_iteration(tc_t *c, const cap_profile_t *p,
                             uint64_t iteration, bool declare,
                             uint32_t batch_ops);
static int tc_send_iteration_end(tc_t *c, uint64_t iteration, int64_t iter_ns,
                                 bool measured, bool incomplete,
                                 uint32_t plan_version, int64_t stall_ns);
/* Wait for a Plan and convert it; NULL on timeout. */
static cap_plan_t *tc_wait_plan(tc_t *c, int timeout_ms);
static uint64_t tc_now_ms(void);
/* VmRSS of a process in KiB (/proc/PID/status), 0 when unknown. */
static uint64_t tc_rss_kb(pid_t pid);
/* In a forked child: Hello as `job`, then n unmanaged IterationEnd frames
 * written as fast as the socket takes them, Bye, and _exit (0, or 2-4 when
 * a step failed). */
static void tc_flood_iteration_ends(const char *sock, const char *job,
                                    uint32_t n);
/* Whether the daemon still serves this session: an ack of a plan version
 * it never sent gets its Error. */
static bool tc_session_answers(tc_t *c);

/* The sanitizers the test is built with. ASan keeps freed memory in
 * quarantine: RSS checks do not hold under it. */
#if defined(__SANITIZE_ADDRESS__)
#define TC_UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TC_UNDER_ASAN 1
#endif
#endif
#if defined(__has_feature)
#if __has_feature(undefined_behavior_sanitizer)
#define TC_UNDER_UBSAN 1
#endif
#endif

/* How long the daemon may take to plan resnet50 at 50 %, the tests' usual
 * job: 2 s in a product build (about 0.5 s, more on a loaded 2-core
 * machine; capuchin-replay waits 3 s for a plan, as a data loader's pause).
 * The sanitizers slow planning 3-10x (resnet50 at 50 %: 3 s CPU under ASan
 * and UBSan), much more on a loaded machine. */
#if defined(TC_UNDER_ASAN) || defined(TC_UNDER_UBSAN)
#define TC_PLAN_LIMIT_MS 60000
#else
#define TC_PLAN_LIMIT_MS 2000
#endif
/* How long a test waits for a plan the daemon computes (a wait ends as soon
 * as the plan comes, so a generous one costs nothing). */
#define TC_PLAN_WAIT_MS (TC_PLAN_LIMIT_MS > 30000 ? TC_PLAN_LIMIT_MS : 30000)

#include "testclient_impl.h"

#endif /* CAP_TESTCLIENT_H */
