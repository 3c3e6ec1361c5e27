/* Shared GPU budget shares (daemon/src/budget.c), computed by hand. */
#include "cap_test.h"
#include "daemon_internal.h"

static void test_fits_gets_requests(void) {
  uint64_t req[] = {30, 50}, fl[] = {10, 10}, out[2];
  CHECK(!cap__budget_shares(req, fl, 2, 100, out));
  CHECK_EQ(out[0], 30);
  CHECK_EQ(out[1], 50);
}

static void test_proportional(void) {
  uint64_t req[] = {100, 300}, fl[] = {0, 0}, out[2];
  CHECK(cap__budget_shares(req, fl, 2, 200, out));
  CHECK_EQ(out[0], 50);
  CHECK_EQ(out[1], 150);
}

static void test_floor_pins_and_others_share_rest(void) {
  /* Proportional would give a 20 of 200, below its floor of 60: it gets 60
   * and b, c share the remaining 140 in proportion 400:400. */
  uint64_t req[] = {100, 400, 500}, fl[] = {60, 0, 0}, out[3];
  CHECK(cap__budget_shares(req, fl, 3, 200, out));
  CHECK_EQ(out[0], 60);
  CHECK_EQ(out[1] + out[2] <= 140, 1);
  CHECK_EQ(out[1], 62); /* 140 * 400 / 900 */
  CHECK_EQ(out[2], 77); /* 140 * 500 / 900 */
  CHECK(out[0] + out[1] + out[2] <= 200);
}

static void test_floor_above_request_capped(void) {
  uint64_t req[] = {10, 1000}, fl[] = {50, 0}, out[2];
  CHECK(cap__budget_shares(req, fl, 2, 500, out));
  CHECK(out[0] <= 10);
  CHECK(out[0] + out[1] <= 500);
}

static void test_huge_values_no_overflow(void) {
  uint64_t req[] = {UINT64_MAX / 2, UINT64_MAX / 2}, fl[] = {1, 1}, out[2];
  CHECK(cap__budget_shares(req, fl, 2, 80ull << 30, out));
  CHECK_EQ(out[0], 40ull << 30);
  CHECK_EQ(out[1], 40ull << 30);
}

/* No one client's claim sets a shared device's size. */
static void test_capacity_from_claims(void) {
  const uint64_t G = 1ull << 30;
  bool ign[4];
  uint64_t one[] = {16 * G};
  CHECK_EQ(cap__budget_capacity(one, 1, ign), 16 * G);
  CHECK(!ign[0]);
  /* A newcomer claiming 1 MiB (or 1 PiB) beside an honest job: ignored. */
  uint64_t small[] = {16 * G, 1u << 20};
  CHECK_EQ(cap__budget_capacity(small, 2, ign), 16 * G);
  CHECK(!ign[0] && ign[1]);
  uint64_t big[] = {16 * G, 1ull << 50};
  CHECK_EQ(cap__budget_capacity(big, 2, ign), 16 * G);
  CHECK(!ign[0] && ign[1]);
  /* The claim most agree with wins, the largest of them is the capacity. */
  uint64_t many[] = {1u << 20, 16 * G, 15 * G, 0};
  CHECK_EQ(cap__budget_capacity(many, 4, ign), 16 * G);
  CHECK(ign[0] && !ign[1] && !ign[2] && !ign[3]);
  uint64_t none[] = {0, 0};
  CHECK_EQ(cap__budget_capacity(none, 2, ign), 0);
}

int main(void) {
  RUN_TEST(test_fits_gets_requests);
  RUN_TEST(test_proportional);
  RUN_TEST(test_floor_pins_and_others_share_rest);
  RUN_TEST(test_floor_above_request_capped);
  RUN_TEST(test_huge_values_no_overflow);
  RUN_TEST(test_capacity_from_claims);
  return TEST_SUMMARY();
}
