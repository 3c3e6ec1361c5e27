/*
 * The recorder ring: single producer, single consumer, fixed records,
 * never blocking. A consumer thread checks that every committed record
 * arrives once, in order, intact; a full ring refuses (the producer counts
 * drops) instead of overwriting.
 */
#include <pthread.h>
#include <stdatomic.h>

#include "../../../client/src/client_impl.h"
#include "cap_test.h"

static void test_full_refuses(void) {
  cap__ring_t r;
  REQUIRE(cap__ring_init(&r, 64) == 0);
  uint64_t s = cap__ring_reserve(&r, 60);
  CHECK_EQ(s, 0);
  cap__ring_commit(&r, 60);
  CHECK(cap__ring_reserve(&r, 5) == UINT64_MAX); /* 60 + 5 > 64 */
  s = cap__ring_reserve(&r, 4);
  CHECK_EQ(s, 60);
  cap__ring_commit(&r, 64);
  CHECK(cap__ring_reserve(&r, 1) == UINT64_MAX);
  /* The consumer frees room. */
  atomic_store(&r.tail, 10);
  CHECK_EQ(cap__ring_reserve(&r, 10), 64);
  CHECK(cap__ring_reserve(&r, 11) == UINT64_MAX);
  cap__ring_close(&r);
}

typedef struct shared {
  cap__ring_t r;
  uint64_t n;
  _Atomic int done;
  uint64_t got, bad;
} shared_t;

static void *consumer(void *arg) {
  shared_t *sh = arg;
  uint64_t expect = 0;
  for (;;) {
    uint64_t tail = atomic_load_explicit(&sh->r.tail, memory_order_relaxed);
    uint64_t head = atomic_load_explicit(&sh->r.head, memory_order_acquire);
    if (tail == head) {
      if (atomic_load(&sh->done) &&
          atomic_load_explicit(&sh->r.head, memory_order_acquire) == tail)
        break;
      continue;
    }
    while (tail < head) {
      const cap__rec_t *rec = cap__ring_at(&sh->r, tail);
      uint32_t n = rec->b; /* records in this group */
      if (rec->type != CAP__REC_OP || rec->a != (uint32_t)expect)
        sh->bad++;
      for (uint32_t i = 1; i < n; i++) {
        const cap__rec_t *cr = cap__ring_at(&sh->r, tail + i);
        if (cr->type != CAP__REC_CONT || cr->u.ids[0] != (uint32_t)expect + i)
          sh->bad++;
      }
      expect++;
      sh->got++;
      tail += n;
    }
    atomic_store_explicit(&sh->r.tail, tail, memory_order_release);
  }
  return NULL;
}

static void test_spsc_threads(void) {
  static shared_t sh;
  memset(&sh, 0, sizeof sh);
  REQUIRE(cap__ring_init(&sh.r, 256) == 0);
  pthread_t th;
  REQUIRE(pthread_create(&th, NULL, consumer, &sh) == 0);
  uint64_t sent = 0, refused = 0;
  for (uint64_t i = 0; i < 200000; i++) {
    uint32_t n = 1 + (uint32_t)(i % 5); /* groups of 1..5 records */
    uint64_t s;
    while ((s = cap__ring_reserve(&sh.r, n)) == UINT64_MAX)
      refused++; /* the recorder would count a drop; here we retry */
    cap__rec_t *rec = cap__ring_at(&sh.r, s);
    rec->type = CAP__REC_OP;
    rec->a = (uint32_t)sent;
    rec->b = n;
    for (uint32_t k = 1; k < n; k++) {
      cap__rec_t *cr = cap__ring_at(&sh.r, s + k);
      cr->type = CAP__REC_CONT;
      cr->u.ids[0] = (uint32_t)sent + k;
    }
    cap__ring_commit(&sh.r, s + n);
    sent++;
  }
  atomic_store(&sh.done, 1);
  pthread_join(th, NULL);
  CHECK_EQ(sh.got, sent);
  CHECK_EQ(sh.bad, 0);
  (void)refused;
  cap__ring_close(&sh.r);
}

static void test_records_are_64_bytes(void) {
  CHECK_EQ(sizeof(cap__rec_t), 64);
}

int main(void) {
  RUN_TEST(test_records_are_64_bytes);
  RUN_TEST(test_full_refuses);
  RUN_TEST(test_spsc_threads);
  return TEST_SUMMARY();
}
