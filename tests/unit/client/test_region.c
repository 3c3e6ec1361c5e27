/*
 * The placement region (client/src/region.c): blocks taken at offsets,
 * refused while a live allocation overlaps (naming it), shared by an output
 * that takes over its input's block, given back in any order, and the
 * cheapest window to evict for an allocation the plan did not place.
 */
#include <stdlib.h>

#include "cap_test.h"
#include "client_impl.h"

static uint8_t mem[4096];

static cap__region_t region(void) {
  return (cap__region_t){.base = mem, .bytes = sizeof mem};
}

static void test_take_and_give(void) {
  cap__region_t r = region();
  void *a, *b, *busy;
  REQUIRE(cap__region_take(&r, 0, 1024, &a, &busy) == 0);
  CHECK(a == mem);
  REQUIRE(cap__region_take(&r, 2048, 1024, &b, &busy) == 0);
  CHECK(b == mem + 2048);
  /* Overlapping either end, or inside: refused, naming the one in the way. */
  void *c = mem;
  CHECK_EQ(cap__region_take(&r, 512, 1024, &c, &busy), CAP_EAGAIN);
  CHECK(c == NULL && busy == a);
  CHECK_EQ(cap__region_take(&r, 1536, 1024, &c, &busy), CAP_EAGAIN);
  CHECK(busy == b);
  CHECK_EQ(cap__region_take(&r, 2304, 256, &c, &busy), CAP_EAGAIN);
  CHECK(busy == b);
  /* The gap between them fits exactly; the end of the region does not. */
  CHECK_EQ(cap__region_take(&r, 1024, 1024, &c, &busy), 0);
  CHECK_EQ(cap__region_take(&r, 3584, 1024, &c, &busy), CAP_ERANGE);
  CHECK_EQ(cap__region_take(&r, 0, 0, &c, &busy), CAP_ERANGE);
  CHECK_EQ(r.n_live, 3);
  /* Given back in any order; a pointer elsewhere is not the region's. */
  CHECK(cap__region_give(&r, b));
  CHECK(cap__region_give(&r, a));
  CHECK(!cap__region_give(&r, mem + sizeof mem));
  CHECK(!cap__region_give(&r, &r));
  CHECK_EQ(r.n_live, 1);
  CHECK_EQ(cap__region_take(&r, 0, 1024, &a, &busy), 0);
  free(r.live);
}

static void test_share(void) {
  cap__region_t r = region();
  void *in, *out, *busy;
  REQUIRE(cap__region_take(&r, 256, 1024, &in, &busy) == 0);
  /* An output no larger than the block takes it over; a larger one, or
   * one at another offset, cannot. */
  CHECK_EQ(cap__region_share(&r, 256, 2048, &out), CAP_ENOENT);
  CHECK_EQ(cap__region_share(&r, 512, 256, &out), CAP_ENOENT);
  REQUIRE(cap__region_share(&r, 256, 768, &out) == 0);
  CHECK(out == in);
  /* The block stays taken until both are given back, in either order. */
  CHECK(cap__region_give(&r, in));
  CHECK_EQ(cap__region_take(&r, 256, 256, &busy, &busy), CAP_EAGAIN);
  CHECK(cap__region_give(&r, out));
  CHECK_EQ(r.n_live, 0);
  void *again;
  CHECK_EQ(cap__region_take(&r, 256, 256, &again, &busy), 0);
  free(r.live);
}

static void test_many(void) {
  /* Hundreds of blocks, taken out of order and given back: the live list
   * stays sorted and disjoint. */
  cap__region_t r = region();
  void *p[16], *busy;
  uint32_t order[16] = {5, 0, 15, 7, 3, 9, 1, 14, 11, 2, 8, 13, 4, 10, 6, 12};
  for (int round = 0; round < 20; round++) {
    for (int i = 0; i < 16; i++)
      REQUIRE(cap__region_take(&r, order[i] * 256, 256, &p[order[i]], &busy) == 0);
    for (uint32_t k = 1; k < r.n_live; k++)
      CHECK(r.live[k - 1].off + r.live[k - 1].len <= r.live[k].off);
    for (int i = 15; i >= 0; i--)
      CHECK(cap__region_give(&r, p[order[(i * 7) % 16]]));
    CHECK_EQ(r.n_live, 0);
  }
  free(r.live);
}

/* Weight: 0 (may not move) for the block at mem + 1024, else its index in
 * a table so that tests can make blocks cheap or dear. */
static uint32_t weights[16];
static uint32_t weight_of(void *ctx, const void *ptr) {
  (void)ctx;
  return weights[((const uint8_t *)ptr - mem) / 256];
}

static void test_find_window(void) {
  cap__region_t r = region();
  void *p, *busy, *win[4];
  /* Blocks of 256 at 0, 1024, 2048 and 3072, holes of 768 between them. */
  for (int i = 0; i < 4; i++)
    REQUIRE(cap__region_take(&r, (uint64_t)i * 1024, 256, &p, &busy) == 0);
  CHECK_EQ(r.live_bytes, 1024);
  for (int i = 0; i < 16; i++)
    weights[i] = 1;
  /* A hole fits: nothing to evict. */
  CHECK_EQ(cap__region_find_window(&r, 768, weight_of, NULL, win, 4), 0);
  /* 1024 needs one block out; any of the first three is as cheap: the
   * lowest window, after nothing, [0, 1024), holds the block at 0. */
  CHECK_EQ(cap__region_find_window(&r, 1024, weight_of, NULL, win, 4), 1);
  CHECK(win[0] == mem);
  /* The block at 0 dear, the one at 1024 fixed, the one at 2048 dearer
   * than 3072: [256, 1280) is out, and [2304, 3328) (after 2048, holding
   * 3072) is the cheapest. */
  weights[0] = 16;
  weights[4] = 0;
  weights[8] = 2;
  CHECK_EQ(cap__region_find_window(&r, 1024, weight_of, NULL, win, 4), 1);
  CHECK(win[0] == mem + 3072);
  /* 3000 bytes must take in the block at 1024 wherever it starts but at
   * 1280, and from 1280 the region is too short: no window. */
  CHECK_EQ(cap__region_find_window(&r, 3000, weight_of, NULL, win, 4), CAP_ENOENT);
  /* Nor one that needs more blocks out than out has room for. */
  weights[4] = 1;
  weights[8] = 1;
  CHECK_EQ(cap__region_find_window(&r, 4096, weight_of, NULL, win, 3), CAP_ENOENT);
  CHECK_EQ(cap__region_find_window(&r, 4096, weight_of, NULL, win, 4), 4);
  CHECK_EQ(cap__region_find_window(&r, 4097, weight_of, NULL, win, 4), CAP_ENOENT);
  /* A shared block does not move either. */
  REQUIRE(cap__region_share(&r, 3072, 256, &p) == 0);
  CHECK_EQ(cap__region_find_window(&r, 4096, weight_of, NULL, win, 4), CAP_ENOENT);
  CHECK(cap__region_give(&r, p));
  for (int i = 0; i < 4; i++)
    CHECK(cap__region_give(&r, mem + i * 1024));
  CHECK_EQ(r.live_bytes, 0);
  free(r.live);
}

int main(void) {
  RUN_TEST(test_take_and_give);
  RUN_TEST(test_share);
  RUN_TEST(test_many);
  RUN_TEST(test_find_window);
  return TEST_SUMMARY();
}
