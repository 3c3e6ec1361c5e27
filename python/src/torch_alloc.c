/*
 * The CUDA allocator of Manager(placement=True) (README, "Placement under
 * PyTorch"): capuchin_torch_alloc and capuchin_torch_free are the two C
 * functions a torch.cuda.memory.CUDAPluggableAllocator loads from this
 * module's shared object (python/capuchin/_placement.py). Every CUDA
 * allocation of the process comes here once it is installed: while a client
 * is bound (Client.place) one for its device goes to it
 * (capuchin/framework_alloc.h: its planned block, or the client's budgeted
 * allocator), anything else to the CUDA runtime, as PyTorch's own
 * allocator would without its cache.
 *
 * PyTorch calls these from whatever thread allocates (the autograd engine
 * runs backward on its own) and with the GIL released or held; the client
 * is driven by the adapter under the GIL, so a call that reaches a client
 * takes the GIL too. One that reaches none takes nothing.
 */
#include "client_object.h" /* Python.h first, as CPython requires */

#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "capuchin/framework_alloc.h"

#define MAX_CLIENTS 16

/* The clients whose memory PyTorch may hold: the bound one (clients[0]
 * while `bound`), then those closed while PyTorch still held some of theirs
 * (a client's arenas go when it is destroyed: these are kept, with their
 * memory, until the process exits). Strong references; GIL. */
static ClientObject *clients[MAX_CLIENTS];
static _Atomic int n_clients;
static bool bound;
static int bound_device;

/* --- The CUDA runtime: PyTorch's own, found in the process ------------- */

static int (*cuda_malloc)(void **p, size_t bytes);
static int (*cuda_free)(void *p);
static pthread_once_t cuda_once = PTHREAD_ONCE_INIT;

static void find_cuda(void) {
  static const char *const libs[] = {NULL, "libcudart.so.12",
                                     "libcudart.so.11.0", "libcudart.so"};
  for (size_t i = 0; i < sizeof libs / sizeof *libs; i++) {
    void *h = libs[i] ? dlopen(libs[i], RTLD_NOW | RTLD_LOCAL) : RTLD_DEFAULT;
    void *m = h ? dlsym(h, "cudaMalloc") : NULL;
    void *f = h ? dlsym(h, "cudaFree") : NULL;
    if (m && f) { /* (POSIX: object and function pointers convert) */
      memcpy(&cuda_malloc, &m, sizeof m);
      memcpy(&cuda_free, &f, sizeof f);
      return;
    }
  }
}

static bool have_cuda(void) {
  pthread_once(&cuda_once, find_cuda);
  return cuda_malloc && cuda_free;
}

/* --- The two functions PyTorch calls ------------------------------------ */

/* Whether the GIL can be taken: not while the interpreter goes down. */
static bool python_up(void) {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsInitialized() && !Py_IsFinalizing();
#else
  return Py_IsInitialized() && !_Py_IsFinalizing();
#endif
}

__attribute__((visibility("default"))) void *
capuchin_torch_alloc(size_t bytes, int device, void *stream) {
  (void)stream; /* ops and the client's copies run on the compute stream */
  void *p = NULL;
  if (atomic_load(&n_clients) && python_up()) {
    PyGILState_STATE g = PyGILState_Ensure();
    if (bound && device == bound_device && clients[0]->c &&
        cap_client_framework_alloc(clients[0]->c, bytes, &p) < 0)
      p = NULL; /* no room even past the plan: the runtime's, uncounted */
    PyGILState_Release(g);
    if (p)
      return p;
  }
  if (!have_cuda() || cuda_malloc(&p, bytes) != 0)
    return NULL; /* PyTorch raises its out-of-memory error */
  return p;
}

__attribute__((visibility("default"))) void
capuchin_torch_free(void *p, size_t bytes, int device, void *stream) {
  (void)bytes;
  (void)device;
  (void)stream;
  if (!p)
    return;
  if (atomic_load(&n_clients)) {
    /* What PyTorch frees as the interpreter goes down may be a client's:
     * it goes with the process. */
    if (!python_up())
      return;
    PyGILState_STATE g = PyGILState_Ensure();
    bool mine = false;
    for (int i = 0; i < atomic_load(&n_clients) && !mine; i++)
      mine = clients[i]->c && cap_client_framework_free(clients[i]->c, p) == 0;
    PyGILState_Release(g);
    if (mine)
      return;
  }
  if (have_cuda()) /* (a free cannot report an error to PyTorch) */
    cuda_free(p);
}

/* --- Binding (the adapter, GIL held) ------------------------------------ */

/* place(device): carry out plans' placements through this client, which
 * serves the process's CUDA allocations on that device from now on. */
static PyObject *Client_place(ClientObject *self, PyObject *arg) {
  int device = PyLong_AsLong(arg);
  if (device == -1 && PyErr_Occurred())
    return NULL;
  if (!self->c) {
    PyErr_SetString(PyExc_ValueError, "the client is closed");
    return NULL;
  }
  if (bound) {
    PyErr_SetString(PyExc_RuntimeError,
                    "capuchin: another client already serves the CUDA "
                    "allocator (one Manager(placement=True) per process)");
    return NULL;
  }
  if (atomic_load(&n_clients) == MAX_CLIENTS) {
    PyErr_SetString(PyExc_RuntimeError, "capuchin: too many clients kept");
    return NULL;
  }
  int rc = cap_client_set_framework_placement(self->c, true);
  if (rc < 0)
    return cap_py_raise_rc(self, rc);
  int n = atomic_load(&n_clients);
  memmove(&clients[1], &clients[0], (size_t)n * sizeof *clients);
  Py_INCREF(self);
  clients[0] = self;
  bound_device = device;
  bound = true;
  atomic_store(&n_clients, n + 1);
  Py_RETURN_NONE;
}

bool cap_py_torch_alloc_keeps(ClientObject *self) {
  int n = atomic_load(&n_clients), i = 0;
  while (i < n && clients[i] != self)
    i++;
  if (i == n)
    return false;
  if (i == 0 && bound)
    bound = false;
  if (self->c && cap_client_framework_lent(self->c))
    return true; /* PyTorch still holds some of its memory */
  memmove(&clients[i], &clients[i + 1], (size_t)(n - i - 1) * sizeof *clients);
  atomic_store(&n_clients, n - 1);
  Py_DECREF(self); /* the caller holds its own reference */
  return false;
}

PyMethodDef cap_py_torch_alloc_methods[] = {
    {"place", (PyCFunction)Client_place, METH_O,
     "place(device): serve the CUDA allocator of Manager(placement=True)"},
    {NULL, NULL, 0, NULL},
};
