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

int main(void) {
  RUN_TEST(test_fits_gets_requests);
  RUN_TEST(test_proportional);
  RUN_TEST(test_floor_pins_and_others_share_rest);
  RUN_TEST(test_floor_above_request_capped);
  RUN_TEST(test_huge_values_no_overflow);
  return TEST_SUMMARY();
}
