/*
 * A minimal test harness: CHECK records a failure and goes on, REQUIRE
 * records it and returns from the test function. Each test file's main()
 * runs its tests with RUN_TEST and ends with TEST_SUMMARY(), which prints
 * "N passed, N failed" and returns the exit status.
 */
#ifndef CAP_TEST_H
#define CAP_TEST_H

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cap_test_failed_checks;
static int cap_test_passed, cap_test_failed;

#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      cap_test_failed_checks++;                                                \
    }                                                                          \
  } while (0)

#define REQUIRE(cond)                                                          \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "%s:%d: REQUIRE failed: %s\n", __FILE__, __LINE__,      \
              #cond);                                                          \
      cap_test_failed_checks++;                                                \
      return;                                                                  \
    }                                                                          \
  } while (0)

#define CHECK_EQ(a, b)                                                         \
  do {                                                                         \
    long long cap__a = (long long)(a), cap__b = (long long)(b);                \
    if (cap__a != cap__b) {                                                    \
      fprintf(stderr, "%s:%d: CHECK_EQ failed: %s == %s (%lld vs %lld)\n",     \
              __FILE__, __LINE__, #a, #b, cap__a, cap__b);                     \
      cap_test_failed_checks++;                                                \
    }                                                                          \
  } while (0)

#define CHECK_STR(a, b)                                                        \
  do {                                                                         \
    const char *cap__a = (a), *cap__b = (b);                                   \
    if (!cap__a || !cap__b || strcmp(cap__a, cap__b) != 0) {                   \
      fprintf(stderr, "%s:%d: CHECK_STR failed: \"%s\" vs \"%s\"\n", __FILE__, \
              __LINE__, cap__a ? cap__a : "(null)",                            \
              cap__b ? cap__b : "(null)");                                     \
      cap_test_failed_checks++;                                                \
    }                                                                          \
  } while (0)

#define RUN_TEST(fn)                                                           \
  do {                                                                         \
    int cap__before = cap_test_failed_checks;                                  \
    fn();                                                                      \
    if (cap_test_failed_checks == cap__before) {                               \
      cap_test_passed++;                                                       \
      printf("ok   %s\n", #fn);                                                \
    } else {                                                                   \
      cap_test_failed++;                                                       \
      printf("FAIL %s\n", #fn);                                                \
    }                                                                          \
    fflush(stdout);                                                            \
  } while (0)

#define TEST_SUMMARY()                                                         \
  (printf("%d passed, %d failed\n", cap_test_passed, cap_test_failed),         \
   cap_test_failed ? 1 : 0)

/* Path of a file under tests/data/ ("traces/resnet50.trace"). */
static inline const char *cap_test_data(const char *rel) {
  static char buf[4096];
  snprintf(buf, sizeof buf, "%s/tests/data/%s", CAP_SOURCE_DIR, rel);
  return buf;
}

#endif /* CAP_TEST_H */
