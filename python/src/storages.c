/*
 * The transient storages of a reported step, adopted by the per-op path
 * itself (python/capuchin/_tensors.py has the id rules): most ops make a
 * new storage that dies a few ops later, and doing that in Python (a
 * record per storage, a weakref.ref subclass and a __dict__ per tensor, a
 * Python finalizer, a Python call to report the free) cost several
 * microseconds per op and fed Python's cyclic collector.
 *
 * Here a storage is a C record in a table keyed by its address; each
 * tensor object on it has one StorageRef, a weak reference (of a C
 * subclass of weakref.ref) that the record owns. The tensor object's weak
 * reference list is the per-object cache: the op path finds the id there
 * (checked against data_ptr(), which set_ may change). When the last
 * tensor object on a storage dies (PyTorch keeps an object alive while C++
 * holds its tensor), the callback, in C, moves its id to the dead list;
 * the frees are reported at the next op boundary (the callback may run
 * inside a client callback, and the client must not be re-entered there).
 *
 * A saved tensor's handle keeps the id alive with a Hold (hold), after
 * its storage may have gone to the host: the record leaves the address
 * map when its last object goes, and its free is due when its last Hold
 * goes too. The Python side finds a tensor on a storage of the table by
 * address for a recompute (light_tensor). At a step's end the storages
 * still alive leave the client (disown), as the Python side's do.
 */
#include "client_object.h" /* Python.h first, as CPython requires */

#include <stdlib.h>

struct cap_py_storage {
  uint64_t base, nbytes;
  uint32_t id;
  struct storage_ref *refs; /* the tensor objects on it: references owned */
  uint32_t holds;           /* Hold objects (saved tensors' handles) */
  int mapped;               /* in the table's address map (an object is on
                               it: its memory cannot be reused) */
  int orphan;               /* the table let it go (a step's end, close):
                               only its holds keep the record */
  cap_py_storage_t *prev, *next; /* tab->held while held and unmapped */
};

typedef struct storage_ref {
  PyWeakReference wr;
  cap_py_storages_t *tab;
  cap_py_storage_t *st; /* NULL once the table let it go */
  uint64_t data_ptr;    /* the tensor's data_ptr() when it was tracked */
  struct storage_ref *prev, *next;
} storage_ref_t;

static PyTypeObject StorageRefType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "capuchin._client.StorageRef",
    .tp_basicsize = sizeof(storage_ref_t),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "a weak reference to a tensor object on a storage of the per-op "
              "path's table",
};

static PyObject *on_dead; /* the references' callback */
static PyObject *s_data_ptr, *s_storage_offset, *s_element_size, *s_nbytes;
static PyObject *s_storage; /* untyped_storage (torch >= 2), else _storage */

/* --- the table: open addressing on the storage's address ------------------ */

static uint32_t slot_of(const cap_py_storages_t *tab, uint64_t base) {
  uint64_t h = base >> 4;
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdULL;
  h ^= h >> 33;
  return (uint32_t)h & (tab->cap - 1);
}

static cap_py_storage_t *find(const cap_py_storages_t *tab, uint64_t base) {
  if (!tab->cap)
    return NULL;
  for (uint32_t i = slot_of(tab, base);; i = (i + 1) & (tab->cap - 1)) {
    cap_py_storage_t *s = tab->slots[i];
    if (!s || s->base == base)
      return s;
  }
}

static void put(cap_py_storages_t *tab, cap_py_storage_t *s) {
  uint32_t i = slot_of(tab, s->base);
  while (tab->slots[i])
    i = (i + 1) & (tab->cap - 1);
  tab->slots[i] = s;
  tab->n++;
}

static int grow(cap_py_storages_t *tab) {
  if (2 * (tab->n + 1) <= tab->cap)
    return 0;
  uint32_t old = tab->cap;
  cap_py_storage_t **slots = tab->slots;
  uint32_t cap = old ? 2 * old : 1024;
  tab->slots = calloc(cap, sizeof *tab->slots);
  if (!tab->slots) {
    tab->slots = slots;
    return -1;
  }
  tab->cap = cap;
  tab->n = 0;
  for (uint32_t i = 0; i < old; i++)
    if (slots[i])
      put(tab, slots[i]);
  free(slots);
  return 0;
}

/* Remove s, moving back the entries after it that probed past its slot. */
static void take_out(cap_py_storages_t *tab, cap_py_storage_t *s) {
  uint32_t mask = tab->cap - 1, i = slot_of(tab, s->base);
  while (tab->slots[i] != s)
    i = (i + 1) & mask;
  tab->slots[i] = NULL;
  tab->n--;
  for (uint32_t j = (i + 1) & mask; tab->slots[j]; j = (j + 1) & mask) {
    uint32_t k = slot_of(tab, tab->slots[j]->base);
    /* the entry at j may move to the hole at i unless its home k lies
     * cyclically in (i, j] */
    if ((i <= j) ? (i < k && k <= j) : (i < k || k <= j))
      continue;
    tab->slots[i] = tab->slots[j];
    tab->slots[j] = NULL;
    i = j;
  }
}

/* The table lets go of every reference of s (no callback will come). */
static void drop_refs(cap_py_storage_t *s) {
  while (s->refs) {
    storage_ref_t *r = s->refs;
    s->refs = r->next;
    r->st = NULL;
    Py_DECREF(r);
  }
}

static int add_dead(cap_py_storages_t *tab, uint32_t id) {
  if (tab->n_dead == tab->cap_dead) {
    uint32_t n = tab->cap_dead ? 2 * tab->cap_dead : 256;
    uint32_t *d = realloc(tab->dead, (size_t)n * sizeof *d);
    if (!d)
      return -1;
    tab->dead = d;
    tab->cap_dead = n;
  }
  tab->dead[tab->n_dead++] = id;
  return 0;
}

static void held_link(cap_py_storages_t *tab, cap_py_storage_t *s) {
  s->prev = NULL;
  s->next = tab->held;
  if (tab->held)
    tab->held->prev = s;
  tab->held = s;
}

static void held_unlink(cap_py_storages_t *tab, cap_py_storage_t *s) {
  if (s->prev)
    s->prev->next = s->next;
  else
    tab->held = s->next;
  if (s->next)
    s->next->prev = s->prev;
}

/* s lost a tensor object or a hold. Once no object is on it, it leaves
 * the address map (its memory may be reused; a held id's bytes are the
 * client's business now); once nothing holds it either, its free is due. */
static void settle(cap_py_storages_t *tab, cap_py_storage_t *s) {
  if (s->refs)
    return;
  if (s->orphan) {
    if (!s->holds)
      free(s);
    return;
  }
  if (s->mapped) {
    take_out(tab, s);
    s->mapped = 0;
    if (s->holds) {
      held_link(tab, s);
      return;
    }
  } else if (s->holds) {
    return;
  } else {
    held_unlink(tab, s);
  }
  /* (out of memory: the free is not reported; the client keeps counting
   * the bytes, which only makes its budget tighter) */
  (void)add_dead(tab, s->id);
  free(s);
}

/* The callback of a StorageRef whose tensor object died. */
static PyObject *ref_dead(PyObject *unused, PyObject *ref) {
  (void)unused;
  if (Py_TYPE(ref) != &StorageRefType)
    Py_RETURN_NONE;
  storage_ref_t *r = (storage_ref_t *)ref;
  cap_py_storage_t *s = r->st;
  if (!s)
    Py_RETURN_NONE;
  if (r->prev)
    r->prev->next = r->next;
  else
    s->refs = r->next;
  if (r->next)
    r->next->prev = r->prev;
  r->st = NULL;
  settle(r->tab, s);
  Py_DECREF(ref); /* the table's reference: last use of r */
  Py_RETURN_NONE;
}

static PyMethodDef ref_dead_def = {"_storage_ref_dead", ref_dead, METH_O, NULL};

/* --- tensor objects ------------------------------------------------------ */

static PyObject *call0(PyObject *obj, PyObject *name) {
  return PyObject_VectorcallMethod(name, &obj,
                                   1 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
}

/* obj.name() as an unsigned 64-bit value: 0, or -1 with an error set. */
static int call_u64(PyObject *obj, PyObject *name, uint64_t *v) {
  PyObject *r = call0(obj, name);
  if (!r)
    return -1;
  *v = PyLong_AsUnsignedLongLong(r);
  Py_DECREF(r);
  return *v == (uint64_t)-1 && PyErr_Occurred() ? -1 : 0;
}

/* t's data_ptr() and the address of its storage (not of its first
 * element). -1 with an exception set (a tensor without storage). */
static int addresses(PyObject *t, uint64_t *dp, uint64_t *base) {
  uint64_t off = 0, esize = 0;
  if (call_u64(t, s_data_ptr, dp) < 0 ||
      call_u64(t, s_storage_offset, &off) < 0)
    return -1;
  if (off && call_u64(t, s_element_size, &esize) < 0)
    return -1;
  *base = *dp - off * esize;
  return 0;
}

static int storage_nbytes(PyObject *t, uint64_t *nbytes) {
  if (!s_storage) {
    int has = PyObject_HasAttrString((PyObject *)Py_TYPE(t), "untyped_storage");
    s_storage =
        PyUnicode_InternFromString(has ? "untyped_storage" : "_storage");
    if (!s_storage)
      return -1;
  }
  PyObject *s = call0(t, s_storage);
  if (!s)
    return -1;
  int rc = call_u64(s, s_nbytes, nbytes);
  Py_DECREF(s);
  return rc;
}

/* The reference of the table on t whose data_ptr is still t's, walking
 * t's weak reference list; NULL when there is none. */
static storage_ref_t *ref_on(PyObject *t, uint64_t *dp) {
  Py_ssize_t off = Py_TYPE(t)->tp_weaklistoffset;
  if (off <= 0)
    return NULL;
  int have_dp = 0;
  for (PyWeakReference *w = *(PyWeakReference **)((char *)t + off); w;
       w = w->wr_next) {
    if (Py_TYPE(w) != &StorageRefType || !((storage_ref_t *)w)->st)
      continue;
    if (!have_dp) {
      if (call_u64(t, s_data_ptr, dp) < 0) {
        PyErr_Clear();
        return NULL;
      }
      have_dp = 1;
    }
    if (((storage_ref_t *)w)->data_ptr == *dp)
      return (storage_ref_t *)w;
  }
  return NULL;
}

long cap_py_storages_cached(PyObject *t) {
  uint64_t dp;
  storage_ref_t *r = ref_on(t, &dp);
  return r ? (long)r->st->id : -1;
}

/* A reference on t for the table, not yet on a storage (made before the
 * storage is looked up: the allocation may run the cyclic collector, whose
 * callbacks may free a storage of the table). */
static storage_ref_t *new_ref(cap_py_storages_t *tab, PyObject *t,
                              uint64_t dp) {
  PyObject *args[] = {t, on_dead};
  storage_ref_t *r = (storage_ref_t *)PyObject_Vectorcall(
      (PyObject *)&StorageRefType, args, 2, NULL);
  if (r) {
    r->tab = tab;
    r->data_ptr = dp;
  }
  return r;
}

static void link_ref(cap_py_storage_t *s, storage_ref_t *r) {
  r->st = s;
  r->prev = NULL;
  r->next = s->refs;
  if (s->refs)
    s->refs->prev = r;
  s->refs = r;
}

/* The storage at base with nbytes, adopted: a new record in the table. */
static cap_py_storage_t *adopt(ClientObject *self, uint64_t base,
                               uint64_t nbytes) {
  cap_py_storages_t *tab = &self->storages;
  cap_py_storage_t *s;
  if (grow(tab) < 0 || !(s = calloc(1, sizeof *s))) {
    PyErr_NoMemory();
    return NULL;
  }
  int rc = cap_client_adopt(self->c, nbytes, (void *)(uintptr_t)base, &s->id);
  if (rc < 0) {
    free(s);
    cap_py_raise_rc(self, rc);
    return NULL;
  }
  s->base = base;
  s->nbytes = nbytes;
  s->mapped = 1;
  put(tab, s);
  return s;
}

/* What cap_py_storages_track does, giving the record too (*out). */
static long track_storage(ClientObject *self, PyObject *t, PyObject *theirs,
                          cap_py_storage_t **out) {
  cap_py_storages_t *tab = &self->storages;
  uint64_t dp, base, nbytes = 0;
  storage_ref_t *had = ref_on(t, &dp);
  if (had) {
    *out = had->st;
    return had->st->id;
  }
  if (addresses(t, &dp, &base) < 0) {
    PyErr_Clear();
    return -1; /* no storage: not managed */
  }
  if (!dp)
    return theirs ? -2 : -1;
  if (theirs) {
    PyObject *key = PyLong_FromUnsignedLongLong(base);
    if (!key)
      return -3;
    int known = PyDict_Contains(theirs, key);
    Py_DECREF(key);
    if (known)
      return known < 0 ? -3 : -2;
  }
  int sized = 0;
  if (!find(tab, base)) {
    if (storage_nbytes(t, &nbytes) < 0)
      return -3;
    sized = 1;
  }
  storage_ref_t *r = new_ref(tab, t, dp);
  if (!r)
    return -3;
  cap_py_storage_t *s = find(tab, base);
  if (!s && !sized) { /* the collector let it go meanwhile */
    if (storage_nbytes(t, &nbytes) < 0) {
      Py_DECREF(r);
      return -3;
    }
    s = find(tab, base);
  }
  /* (no allocation of Python objects from here on) */
  if (!s && !(s = adopt(self, base, nbytes))) {
    Py_DECREF(r);
    return -3;
  }
  link_ref(s, r);
  *out = s;
  return s->id;
}

long cap_py_storages_track(ClientObject *self, PyObject *t, PyObject *theirs) {
  cap_py_storage_t *s;
  return track_storage(self, t, theirs, &s);
}

/* An id was freed on the device at dev. If dev is a storage of the
 * Python side's table, it is a buffer the adapter allocated when the
 * client brought the id back (transient ids are never otherwise there;
 * the address alone does not tell, since the allocator may have put the
 * buffer where the id's first storage was). The client calls release only
 * for memory it evicts or abandons, so the Python side lets the buffer go
 * at its next flush (self->freed_bufs is one of the lists it watches). */
static void buffer_freed(ClientObject *self, void *dev) {
  if (!self->freed_bufs || !self->by_ptr)
    return;
  PyObject *addr = PyLong_FromVoidPtr(dev);
  int theirs = addr ? PyDict_Contains(self->by_ptr, addr) : -1;
  if (theirs < 0 || (theirs && PyList_Append(self->freed_bufs, addr) < 0))
    PyErr_Clear(); /* (the buffer stays until the client is closed) */
  Py_XDECREF(addr);
}

void cap_py_storages_report_frees(ClientObject *self) {
  cap_py_storages_t *tab = &self->storages;
  /* A free's release callback runs Python, whose collector may add to the
   * list meanwhile (this loop reports those too), and which must not
   * report the list again. */
  if (tab->reporting)
    return;
  tab->reporting = 1;
  for (uint32_t i = 0; i < tab->n_dead; i++) {
    uint32_t id = tab->dead[i];
    void *dev = self->c ? cap_client_tensor_ptr(self->c, id) : NULL;
    if (self->c)
      (void)cap_client_free(self->c, id); /* (a refused one is already
                                             gone) */
    if (PyErr_Occurred()) /* a callback raised and was reported */
      PyErr_Clear();
    if (dev)
      buffer_freed(self, dev);
  }
  tab->n_dead = 0;
  tab->reporting = 0;
}

/* s leaves the table: its id goes to the dead list when free_id is set;
 * a held one stays for its holds. */
static void let_go(cap_py_storages_t *tab, cap_py_storage_t *s, int free_id) {
  if (free_id)
    (void)add_dead(tab, s->id);
  drop_refs(s);
  s->orphan = 1;
  if (!s->holds)
    free(s);
}

/* Every storage leaves the table; their ids go to the dead list when
 * free_ids is set. */
static void empty_table(cap_py_storages_t *tab, int free_ids) {
  cap_py_storage_t **slots = tab->slots;
  uint32_t cap = tab->cap;
  tab->slots = NULL;
  tab->cap = tab->n = 0;
  for (uint32_t i = 0; i < cap; i++)
    if (slots[i])
      let_go(tab, slots[i], free_ids);
  free(slots);
  while (tab->held) {
    cap_py_storage_t *s = tab->held;
    tab->held = s->next;
    let_go(tab, s, free_ids);
  }
}

void cap_py_storages_clear(ClientObject *self) {
  empty_table(&self->storages, 0);
  free(self->storages.dead);
  self->storages.dead = NULL;
  self->storages.n_dead = self->storages.cap_dead = 0;
}

/* --- the Python side's calls --------------------------------------------- */

static int check_open(ClientObject *self) {
  if (self->c)
    return 0;
  PyErr_SetString(PyExc_ValueError, "the client is closed");
  return -1;
}

/* track(tensor) -> id, None or False: the id of t's storage, adopted when
 * the table does not hold it, as the op path finds it; None: t has no
 * storage; False: the storage is the Python side's (its table, given to
 * set_op_path, has the address, or the data pointer is null). */
static PyObject *Client_track(ClientObject *self, PyObject *t) {
  if (check_open(self) < 0)
    return NULL;
  long id = cap_py_storages_track(self, t, self->by_ptr);
  if (id == -3)
    return NULL;
  if (id == -2)
    Py_RETURN_FALSE;
  if (id < 0)
    Py_RETURN_NONE;
  return PyLong_FromLong(id);
}

/* A Hold keeps the id of a storage of the table alive: a saved tensor's
 * handle has one, and so has the tensor unpack makes of it, while the
 * storage itself may be gone to the host. */
typedef struct {
  PyObject_HEAD
  PyObject *client;
  cap_py_storage_t *st;
} hold_t;

static void Hold_dealloc(hold_t *h) {
  cap_py_storage_t *s = h->st;
  s->holds--;
  settle(&((ClientObject *)h->client)->storages, s);
  Py_DECREF(h->client);
  PyObject_Free(h);
}

static PyObject *Hold_id(hold_t *h, void *unused) {
  (void)unused;
  return PyLong_FromUnsignedLong(h->st->id);
}

static PyGetSetDef Hold_getset[] = {
    {"id", (getter)Hold_id, NULL, "the tensor id", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject HoldType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "capuchin._client.Hold",
    .tp_basicsize = sizeof(hold_t),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_dealloc = (destructor)Hold_dealloc,
    .tp_getset = Hold_getset,
    .tp_doc = "keeps a tensor id of the per-op path's table alive",
};

/* hold(tensor) -> Hold or None: t's storage (adopted if new) keeps its id
 * while the Hold lives; None for a storage of the Python side's (a weight,
 * a buffer) or none. */
static PyObject *Client_hold(ClientObject *self, PyObject *t) {
  if (check_open(self) < 0)
    return NULL;
  cap_py_storage_t *s;
  long id = track_storage(self, t, self->by_ptr, &s);
  if (id == -3)
    return NULL;
  if (id < 0)
    Py_RETURN_NONE;
  /* (s cannot go meanwhile: t, alive, is on it) */
  hold_t *h = PyObject_New(hold_t, &HoldType);
  if (!h)
    return NULL;
  h->client = Py_NewRef((PyObject *)self);
  h->st = s;
  s->holds++;
  return (PyObject *)h;
}

/* light_tensor(address) -> a live tensor object on the table's storage at
 * address, or None. */
static PyObject *Client_light_tensor(ClientObject *self, PyObject *arg) {
  uint64_t base = PyLong_AsUnsignedLongLong(arg);
  if (base == (uint64_t)-1 && PyErr_Occurred())
    return NULL;
  cap_py_storage_t *s = find(&self->storages, base);
  for (storage_ref_t *r = s ? s->refs : NULL; r; r = r->next) {
    PyObject *o = PyWeakref_GET_OBJECT((PyObject *)r);
    if (o != Py_None)
      return Py_NewRef(o);
  }
  Py_RETURN_NONE;
}

static PyObject *Client_report_frees(ClientObject *self, PyObject *unused) {
  (void)unused;
  cap_py_storages_report_frees(self);
  Py_RETURN_NONE;
}

/* disown(): a step ends: the storages still alive (what the caller keeps)
 * leave the client, so that the next step's i-th storage gets the id the
 * i-th got before; used again, one is adopted again. */
static PyObject *Client_disown(ClientObject *self, PyObject *unused) {
  (void)unused;
  empty_table(&self->storages, 1);
  cap_py_storages_report_frees(self);
  Py_RETURN_NONE;
}

PyMethodDef cap_py_storages_methods[] = {
    {"track", (PyCFunction)Client_track, METH_O,
     "track(tensor) -> id, None or False (the Python side's): adopts a "
     "transient storage"},
    {"hold", (PyCFunction)Client_hold, METH_O,
     "hold(tensor) -> Hold or None: keeps the id of t's storage alive"},
    {"light_tensor", (PyCFunction)Client_light_tensor, METH_O,
     "light_tensor(address) -> a tensor on the table's storage there, or None"},
    {"report_frees", (PyCFunction)Client_report_frees, METH_NOARGS,
     "report_frees(): the frees of storages whose last tensor went"},
    {"disown", (PyCFunction)Client_disown, METH_NOARGS,
     "disown(): every storage of the table leaves the client (a step's end)"},
    {NULL, NULL, 0, NULL},
};

int cap_py_storages_ready(void) {
  StorageRefType.tp_base = &_PyWeakref_RefType;
  if (PyType_Ready(&StorageRefType) < 0 || PyType_Ready(&HoldType) < 0)
    return -1;
  on_dead = PyCFunction_New(&ref_dead_def, NULL);
  s_data_ptr = PyUnicode_InternFromString("data_ptr");
  s_storage_offset = PyUnicode_InternFromString("storage_offset");
  s_element_size = PyUnicode_InternFromString("element_size");
  s_nbytes = PyUnicode_InternFromString("nbytes");
  return on_dead && s_data_ptr && s_storage_offset && s_element_size && s_nbytes
             ? 0
             : -1;
}
