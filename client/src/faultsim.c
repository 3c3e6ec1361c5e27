#include "faultsim.h"

#include <stdatomic.h>

/* One countdown per point. `countdown` > 0: calls left before the first
 * failure; `repeat` > 0: failures left once it is reached, < 0: forever.
 * A relaxed load of `armed` keeps the unarmed fast path to one load. */
typedef struct {
  atomic_bool armed;
  atomic_llong countdown;
  atomic_llong repeat;
  atomic_ullong injected;
} fault_point;

static fault_point points[CAP_FAULT_COUNT];

void cap_faultsim_arm(cap_fault_t point, int64_t countdown, int64_t repeat) {
  if ((unsigned)point >= CAP_FAULT_COUNT)
    return;
  fault_point *p = &points[point];
  atomic_store(&p->armed, false);
  if (countdown <= 0)
    return;
  atomic_store(&p->countdown, countdown);
  atomic_store(&p->repeat, repeat == 0 ? 1 : repeat);
  atomic_store(&p->armed, true);
}

void cap_faultsim_reset(void) {
  for (int i = 0; i < CAP_FAULT_COUNT; i++) {
    atomic_store(&points[i].armed, false);
    atomic_store(&points[i].countdown, 0);
    atomic_store(&points[i].repeat, 0);
    atomic_store(&points[i].injected, 0);
  }
}

bool cap_faultsim_step(cap_fault_t point) {
  if ((unsigned)point >= CAP_FAULT_COUNT)
    return false;
  fault_point *p = &points[point];
  if (!atomic_load_explicit(&p->armed, memory_order_relaxed))
    return false;
  /* Count down to the failing call; each caller takes one step. */
  long long left = atomic_fetch_sub(&p->countdown, 1) - 1;
  if (left > 0)
    return false;
  long long rep = atomic_load(&p->repeat);
  if (rep < 0) {
    atomic_fetch_add(&p->injected, 1);
    return true;
  }
  /* Failures left: repeat - (calls past the first failing one). */
  if (-left < rep) {
    atomic_fetch_add(&p->injected, 1);
    if (-left + 1 >= rep)
      atomic_store(&p->armed, false);
    return true;
  }
  atomic_store(&p->armed, false);
  return false;
}

uint64_t cap_faultsim_injected(cap_fault_t point) {
  if ((unsigned)point >= CAP_FAULT_COUNT)
    return 0;
  return atomic_load(&points[point].injected);
}
