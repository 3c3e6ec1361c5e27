/*
 * The transient storages the per-op path adopts itself (storages.c): a C
 * table keyed by the storage's address, with no Python object per storage
 * and one weak reference per tensor object on it, whose death is noticed
 * in C and reported as a free at the next op boundary.
 */
#ifndef CAPUCHIN_PY_STORAGES_H
#define CAPUCHIN_PY_STORAGES_H

#include <stdint.h>

typedef struct cap_py_storage cap_py_storage_t;

typedef struct {
  cap_py_storage_t **slots; /* open addressing by storage address */
  uint32_t cap, n;
  cap_py_storage_t *held; /* held ids no tensor object is on any more */
  uint32_t *dead; /* ids whose last tensor object and hold went: frees to
                     report */
  uint32_t n_dead, cap_dead;
  int reporting; /* the frees are being reported */
} cap_py_storages_t;

#endif /* CAPUCHIN_PY_STORAGES_H */
