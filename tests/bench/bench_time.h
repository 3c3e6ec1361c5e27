/*
 * What the benchmarks time with: a monotonic clock and the process's CPU
 * time in milliseconds, and a qsort order for doubles (medians and percentiles of repeated runs).
 */
#ifndef CAP_BENCH_TIME_H
#define CAP_BENCH_TIME_H

#include <time.h>

static inline double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* CPU time this process has used: what a planning run would take on a
 * quiet machine, where wall time on a shared one also counts the other
 * jobs' turns on the cores. */
static inline double cpu_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static inline int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

#endif /* CAP_BENCH_TIME_H */
