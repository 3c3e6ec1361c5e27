/*
 * Polling copies in stream order (device.c, cap__ev_poll): copies on one
 * stream end in the order they were issued, so a pass over the copies in
 * flight asks the backend about each stream's copies only up to the first
 * one still running. On a GPU every question is a driver call: GPT-2 at
 * 50 % on an H200 made 40 694 of them in two steps (23.5 ms of host time),
 * the client asking about every copy in flight at every op.
 *
 * Copies out run at 0.1 GB/s on the sim backend, so that the first one
 * (64 MiB, 0.67 s) is still running however loaded the machine is.
 */
#include <stdio.h>
#include <string.h>

#include "cap_test.h"
#include "client_impl.h"

#define MIB (UINT64_C(1) << 20)

static cap__dev_t *open_dev(void) {
  cap_client_config_t cfg;
  cap_client_config_init(&cfg);
  cfg.backend = "sim";
  cfg.time_scale = 1.0;
  cfg.sim_d2h_gbps = 0.1;
  cfg.sim_h2d_gbps = 50;
  cfg.sim_duplex_gbps = 50;
  cap__dev_t *d = NULL;
  cap__dev_info_t info;
  char err[256];
  if (cap__dev_open(&cfg, &d, &info, err, sizeof err) != 0) {
    fprintf(stderr, "cap__dev_open: %s\n", err);
    return NULL;
  }
  return d;
}

static void test_a_running_copy_stops_the_questions_on_its_stream(void) {
  cap__dev_t *d = open_dev();
  REQUIRE(d != NULL);
  const uint64_t bytes[4] = {64 * MIB, 1 * MIB, 1 * MIB, 1 * MIB};
  void *dev[5] = {0}, *host[5] = {0};
  cap__ev_t *ev[5] = {0};
  for (int i = 0; i < 4; i++) {
    REQUIRE(cap__dev_alloc(d, bytes[i], &dev[i]) == 0);
    REQUIRE(cap__host_alloc(d, bytes[i], &host[i]) == 0);
    REQUIRE(cap__copy_d2h(d, host[i], dev[i], bytes[i], &ev[i]) == 0);
  }
  /* and one copy in, on its own stream: a small one, soon done */
  REQUIRE(cap__dev_alloc(d, MIB, &dev[4]) == 0);
  REQUIRE(cap__host_alloc(d, MIB, &host[4]) == 0);
  REQUIRE(cap__copy_h2d(d, dev[4], host[4], MIB, &ev[4]) == 0);
  REQUIRE(cap__ev_sync(d, ev[4]) == 0);

  cap__poll_t poll;
  cap__poll_begin(&poll);
  uint64_t q0 = cap__dev_event_queries(d);
  /* The later copies out first: each is asked, since no earlier one is
   * known to run yet... */
  CHECK_EQ(cap__ev_poll(d, ev[3], &poll), 0);
  CHECK_EQ(cap__dev_event_queries(d) - q0, 1);
  /* ...then the first: running, and from now on the rest of its stream
   * is not asked. */
  CHECK_EQ(cap__ev_poll(d, ev[0], &poll), 0);
  CHECK_EQ(cap__ev_poll(d, ev[1], &poll), 0);
  CHECK_EQ(cap__ev_poll(d, ev[2], &poll), 0);
  CHECK_EQ(cap__ev_poll(d, ev[3], &poll), 0);
  CHECK_EQ(cap__dev_event_queries(d) - q0, 2);
  /* The other stream is asked, and its copy is done. */
  CHECK_EQ(cap__ev_poll(d, ev[4], &poll), 1);
  CHECK_EQ(cap__dev_event_queries(d) - q0, 3);

  /* Once they are all done, a new poll asks about each and hears so. */
  REQUIRE(cap__ev_sync(d, ev[3]) == 0);
  cap__poll_begin(&poll);
  q0 = cap__dev_event_queries(d);
  for (int i = 0; i < 4; i++)
    CHECK_EQ(cap__ev_poll(d, ev[i], &poll), 1);
  CHECK_EQ(cap__dev_event_queries(d) - q0, 4);

  for (int i = 0; i < 5; i++) {
    cap__ev_release(d, ev[i]);
    cap__dev_free(d, dev[i]);
    cap__host_free(d, host[i], i < 4 ? bytes[i] : MIB);
  }
  cap__dev_close(d);
}

int main(void) {
  RUN_TEST(test_a_running_copy_stops_the_questions_on_its_stream);
  return TEST_SUMMARY();
}
