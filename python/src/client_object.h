/*
 * capuchin._client's Client object, shared by capuchin_client.c (the type,
 * its set-up and the calls between ops) and op_path.c (the per-op path:
 * one C call per op from the adapter's TorchDispatchMode).
 */
#ifndef CAPUCHIN_PY_CLIENT_OBJECT_H
#define CAPUCHIN_PY_CLIENT_OBJECT_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdbool.h>
#include <stdint.h>

#include "capuchin/client.h"
#include "capuchin/framework.h"

#define MAX_IDS 4096

/* The op sequence of one iteration: each op's name (interned, compared by
 * address) and its input and output ids. */
typedef struct {
  const char *name;
  uint32_t off, n_in, n_out; /* ids[off .. off + n_in + n_out) */
} op_sig_op_t;

typedef struct {
  op_sig_op_t *ops;
  uint32_t n_ops, cap_ops;
  uint32_t *ids;
  uint32_t n_ids, cap_ids;
} op_sig_t;

/* The transient storages the per-op path adopted itself (storages.c). */
typedef struct cap_py_stor cap_py_stor_t;
typedef struct {
  cap_py_stor_t **slots; /* open addressing on the storage's address */
  uint32_t cap, n;
  uint32_t *dead; /* ids whose last tensor object died: frees to report */
  uint32_t n_dead, cap_dead;
  uint32_t lost_frees; /* frees never reported (out of memory) */
} cap_py_storages_t;

typedef struct {
  PyObject_HEAD
  cap_client_t *c;
  PyObject *alloc_cb;     /* alloc(id, nbytes) -> address */
  PyObject *release_cb;   /* release(id, address, nbytes) */
  PyObject *recompute_cb; /* recompute(seq, name, in_ids, in_addrs, out_ids,
                             out_addrs) -> bool */
  PyObject *names;        /* op name -> bytes: keeps the C strings alive for
                             the client's lifetime, as op_begin requires */
  uint32_t ids[2 * MAX_IDS];

  /* The per-op path (op_path.c). */
  int on;              /* a reported step: dispatch may handle ops itself */
  int diverged_at;     /* op seq at which this guided iteration left the
                          plan's op sequence, -1: it has not */
  uint32_t op_seq;     /* ops reported this iteration */
  cap_mode_t mode;     /* this iteration's mode, as it began */
  int cur_ok;          /* cur holds every op of this iteration so far */
  op_sig_t cur;        /* this iteration's ops (measured iterations) */
  op_sig_t plan;       /* the measured iteration's, which the plan is for */
  PyObject *slow;      /* slow(func, args, kwargs) -> out: the adapter's
                          Python path, for every op dispatch does not take */
  PyObject *id_of;     /* id_of(tensor) -> id or None: adopts a storage */
  PyObject *stop;      /* stop(reason): the step stops reporting */
  PyObject *by_ptr;    /* the adapter's storage table, address -> Storage */
  PyObject *watch;     /* a tuple of the adapter's lists of work due
                          before the next op (frees to report, memory to
                          let go) */
  PyObject *flush;     /* flush(): does that work */
  PyObject *give_up;   /* one of them: weights released but not yet given
                          up; an op that may use one goes to the slow path,
                          which brings it back first */
  PyObject *tensor_type;
  PyObject *slow_funcs; /* ops that always take the slow path */
  PyObject *func_names; /* func -> interned name (bytes), None: slow */
  PyObject *gone;       /* the adapter's weights given up (storage key ->
                           Storage): while there is one, the Python path
                           looks every new storage up */
  PyObject *strided;    /* torch.strided */
  PyObject *device;     /* the job's torch.device (None: not known yet): a
                           new storage elsewhere is not managed */
  int fast_adopt;       /* new storages may be adopted here (storages.c),
                           not through id_of */
  cap_py_storages_t storages;
} ClientObject;

extern PyObject *CapError;

PyObject *cap_py_raise_rc(ClientObject *self, int rc);
const char *cap_py_intern_name(ClientObject *self, PyObject *name);
/* ids from a tuple or list of ints into self->ids + off. */
int cap_py_read_ids(ClientObject *self, PyObject *seq, uint32_t off,
                    uint32_t *n);

/* op_path.c */
extern PyMethodDef cap_py_op_path_methods[];
/* The iteration begins (mode) and ends (its op sequence becomes the plan's
 * when it was measured and every op was reported). */
void cap_py_op_path_begin(ClientObject *self, cap_mode_t mode);
void cap_py_op_path_end(ClientObject *self, cap_mode_t mode);
/* The adapter stopped reporting this iteration. */
void cap_py_op_path_stopped(ClientObject *self);
void cap_py_op_path_clear(ClientObject *self);

/* storages.c: the transient storages the per-op path adopts and frees. */
extern PyMethodDef cap_py_storages_methods[];
int cap_py_storages_ready(void);
int cap_py_storages_set_torch(PyObject *tensor_type);
/* The id the table caches on tensor object t, -1: none that holds. */
long cap_py_storages_cached(PyObject *t);
/* t's id, adopting its storage if it is new: an id, or one of these. */
#define CAP_PY_ST_ERROR (-1)     /* an exception is set */
#define CAP_PY_ST_UNMANAGED (-2) /* not a strided storage */
#define CAP_PY_ST_PYTHON (-3)    /* the Python side's: ask id_of */
long cap_py_storages_id_of(ClientObject *self, PyObject *t);
/* Whether tensor t is off the job's device (not its memory: unmanaged, as
 * the Python path's _id_of has it): 1, 0, or -1 with an exception set. */
int cap_py_storages_off_device(ClientObject *self, PyObject *t);
/* Whether tensor t has no memory (no elements and data_ptr() 0: an empty
 * tensor; not the job's memory either; a weight given up has elements):
 * 1, 0, or -1 with an exception set. */
int cap_py_storages_no_memory(PyObject *t);
/* Reports the frees due (at an op boundary: never from a callback). */
void cap_py_storages_report_dead(ClientObject *self);
/* The storages still alive leave the client (a step's end). */
void cap_py_storages_disown(ClientObject *self);
/* Forgets everything without telling the client (it is closed). */
void cap_py_storages_clear(ClientObject *self);

/* torch_alloc.c: Client.place, and whether Client.close must keep the
 * client because PyTorch still holds memory from it (it is no longer the
 * allocator's then; false: destroy it). */
extern PyMethodDef cap_py_torch_alloc_methods[];
bool cap_py_torch_alloc_keeps(ClientObject *self);

#endif /* CAPUCHIN_PY_CLIENT_OBJECT_H */
