/*
 * The transient storages the per-op path adopts itself (op_path.c): most
 * ops make a new storage that dies a few ops later, and adopting it and
 * reporting its free in Python (records, a weak reference and a finalizer
 * per tensor object, a call to report the free) cost several microseconds
 * per op and fed Python's cyclic collector.
 *
 * A storage here is a C record (stor_t) in a table keyed by its address.
 * Each tracked tensor object on it has one StorageRef, a weak reference (a
 * C subclass of weakref.ref) that the record owns. It is the tensor
 * object's cache too, found on the object's list of weak references, with
 * the data_ptr() the object had (no __dict__ to make and look in: that
 * was a fifth of the cost of a new storage). When a tensor object dies
 * the reference's callback (C) unlinks it;
 * when the last one goes the record leaves the table (its address may be
 * reused) and its id joins the dead list, reported to the client at the
 * next op boundary (the callback may run inside a client callback, where
 * the client must not be re-entered).
 *
 * The Python side (python/capuchin/_tensors.py) keeps everything else: a
 * storage it needs to know (a saved tensor, a recompute's input, a lookup
 * by the Python path) is taken over whole (take_storage): the record
 * leaves the table and its live tensor objects go to the Python records.
 * An address is in at most one of the two tables: each looks in the other
 * before it adopts.
 *
 * Lifetimes, which every function here keeps to:
 * - A record owns one reference to each StorageRef on its list, and each
 *   of those points back at it (ref->rec). A reference not on a list has
 *   rec == NULL. A record is freed only once its list is empty.
 * - Nothing here holds a record pointer across a call that may run Python
 *   code or allocate a Python object: either may run the cyclic collector,
 *   whose weak reference callbacks may free any record. Records are looked
 *   up again after such calls.
 * - The callbacks run with the GIL held (whoever drops the last reference
 *   to a tensor object holds it), so the table needs no other lock.
 */
#include "client_object.h" /* Python.h first, as CPython requires */

#include <stdlib.h>
#include <string.h>

typedef struct storage_ref storage_ref_t;

struct cap_py_stor {
  uint64_t base, nbytes;
  uint32_t id;
  uint32_t nobj;       /* StorageRefs on refs */
  storage_ref_t *refs; /* owned references */
  cap_py_storages_t *tab;
};

struct storage_ref {
  PyWeakReference wr;
  cap_py_stor_t *rec; /* NULL when on no record's list */
  uint64_t data_ptr;  /* the tensor's data_ptr() when it was tracked */
  storage_ref_t *prev, *next;
};

static PyTypeObject StorageRefType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "capuchin._client.StorageRef",
    .tp_basicsize = sizeof(storage_ref_t),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "a weak reference to a tensor object on a storage of the "
              "per-op path's table",
};

static PyObject *on_dead; /* the references' callback */
static PyObject *s_numel, *s_data_ptr, *s_storage_offset, *s_element_size,
    *s_layout, *s_device, *s_nbytes, *s_storage;

/* --- the table: open addressing on the storage's address ------------------ */

static uint32_t slot_of(const cap_py_storages_t *tab, uint64_t base) {
  uint64_t h = base >> 4;
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdULL;
  h ^= h >> 33;
  return (uint32_t)h & (tab->cap - 1);
}

static cap_py_stor_t *find(const cap_py_storages_t *tab, uint64_t base) {
  if (!tab->cap)
    return NULL;
  for (uint32_t i = slot_of(tab, base);; i = (i + 1) & (tab->cap - 1)) {
    cap_py_stor_t *s = tab->slots[i];
    if (!s || s->base == base)
      return s;
  }
}

static void put(cap_py_storages_t *tab, cap_py_stor_t *s) {
  uint32_t i = slot_of(tab, s->base);
  while (tab->slots[i])
    i = (i + 1) & (tab->cap - 1);
  tab->slots[i] = s;
  tab->n++;
}

/* Room for one more entry (at most half full). */
static int reserve(cap_py_storages_t *tab) {
  if (2 * (tab->n + 1) <= tab->cap)
    return 0;
  uint32_t old = tab->cap;
  cap_py_stor_t **slots = tab->slots;
  uint32_t cap = old ? 2 * old : 1024;
  cap_py_stor_t **fresh = calloc(cap, sizeof *fresh);
  if (!fresh)
    return -1;
  tab->slots = fresh;
  tab->cap = cap;
  tab->n = 0;
  for (uint32_t i = 0; i < old; i++)
    if (slots[i])
      put(tab, slots[i]);
  free(slots);
  return 0;
}

/* Remove s (by identity), moving back the entries after it that probed
 * past its slot. */
static void take_out(cap_py_storages_t *tab, cap_py_stor_t *s) {
  uint32_t mask = tab->cap - 1, i = slot_of(tab, s->base);
  while (tab->slots[i] != s)
    i = (i + 1) & mask;
  tab->slots[i] = NULL;
  tab->n--;
  for (uint32_t j = (i + 1) & mask; tab->slots[j]; j = (j + 1) & mask) {
    uint32_t k = slot_of(tab, tab->slots[j]->base);
    /* the entry at j stays unless its home k lies cyclically in (i, j] */
    if ((i <= j) ? (i < k && k <= j) : (i < k || k <= j))
      continue;
    tab->slots[i] = tab->slots[j];
    tab->slots[j] = NULL;
    i = j;
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

/* --- references --------------------------------------------------------- */

static void link_ref(cap_py_stor_t *s, storage_ref_t *r, uint64_t data_ptr) {
  Py_INCREF(r); /* the record's */
  r->rec = s;
  r->data_ptr = data_ptr;
  r->prev = NULL;
  r->next = s->refs;
  if (s->refs)
    s->refs->prev = r;
  s->refs = r;
  s->nobj++;
}

/* Takes r off its record's list; the caller owns the record's reference
 * to r from then on. */
static void unlink_ref(storage_ref_t *r) {
  cap_py_stor_t *s = r->rec;
  if (r->prev)
    r->prev->next = r->next;
  else
    s->refs = r->next;
  if (r->next)
    r->next->prev = r->prev;
  r->prev = r->next = NULL;
  r->rec = NULL;
  s->nobj--;
}

/* The callback of every StorageRef: its tensor object died. */
static PyObject *ref_dead(PyObject *unused, PyObject *arg) {
  (void)unused;
  if (!PyObject_TypeCheck(arg, &StorageRefType))
    Py_RETURN_NONE;
  storage_ref_t *r = (storage_ref_t *)arg;
  cap_py_stor_t *s = r->rec;
  if (!s) /* taken over, or the table let go of it */
    Py_RETURN_NONE;
  unlink_ref(r);
  if (s->nobj == 0) {
    cap_py_storages_t *tab = s->tab;
    take_out(tab, s);
    if (add_dead(tab, s->id) < 0)
      tab->lost_frees++; /* out of memory: the client never hears of it */
    free(s);
  }
  /* The record's reference. Whoever called us (the collector, or the
   * tensor object's weak reference list) no longer needs r after this. */
  Py_DECREF(r);
  Py_RETURN_NONE;
}

/* The table lets go of s: no reference points at it any more. The caller
 * has taken it out of the table. Only StorageRef deallocations can run
 * here (no callback: they are off the list first). */
static void release_rec(cap_py_stor_t *s) {
  while (s->refs) {
    storage_ref_t *r = s->refs;
    unlink_ref(r);
    Py_DECREF(r);
  }
  free(s);
}

/* --- the per-op path ------------------------------------------------------ */

static PyMethodDef on_dead_def = {"_storage_ref_dead", ref_dead, METH_O,
                                  "a tracked tensor object died"};

int cap_py_storages_ready(void) {
  if (on_dead)
    return 0;
  StorageRefType.tp_base = &_PyWeakref_RefType;
  if (PyType_Ready(&StorageRefType) < 0)
    return -1;
  s_numel = PyUnicode_InternFromString("numel");
  s_data_ptr = PyUnicode_InternFromString("data_ptr");
  s_storage_offset = PyUnicode_InternFromString("storage_offset");
  s_element_size = PyUnicode_InternFromString("element_size");
  s_layout = PyUnicode_InternFromString("layout");
  s_device = PyUnicode_InternFromString("device");
  s_nbytes = PyUnicode_InternFromString("nbytes");
  on_dead = PyCFunction_New(&on_dead_def, NULL);
  return s_numel && s_data_ptr && s_storage_offset && s_element_size &&
                 s_layout && s_device && s_nbytes && on_dead
             ? 0
             : -1;
}

int cap_py_storages_set_torch(PyObject *tensor_type) {
  /* torch >= 2.0: untyped_storage(); 1.13: _storage() (storage() builds a
   * TypedStorage in Python on every call) */
  const char *m = PyObject_HasAttrString(tensor_type, "untyped_storage")
                      ? "untyped_storage"
                      : "_storage";
  PyObject *s = PyUnicode_InternFromString(m);
  if (!s)
    return -1;
  Py_XSETREF(s_storage, s);
  return 0;
}

static PyObject *call0(PyObject *t, PyObject *name) {
  return PyObject_VectorcallMethod(name, &t, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET,
                                   NULL);
}

/* An int method of t (data_ptr(), storage_offset(), ...) as uint64. 0 with
 * *ok = 0 on an error (set). */
static uint64_t call_u64(PyObject *t, PyObject *name, int *ok) {
  PyObject *v = call0(t, name);
  if (!v) {
    *ok = 0;
    return 0;
  }
  uint64_t x = PyLong_AsUnsignedLongLong(v);
  Py_DECREF(v);
  if (x == (uint64_t)-1 && PyErr_Occurred())
    *ok = 0;
  return x;
}

/* The first of the table's references on t's weak reference list that is
 * on a record and noted data_ptr (any, for dp == 0), or NULL. Runs no
 * Python code. */
static storage_ref_t *ref_on(PyObject *t, uint64_t dp) {
  /* Negative from Python 3.12 on, for a class whose weak references the
   * interpreter manages (torch.Tensor): the list is then in front of the
   * object, at the same sum (CPython's _PyObject_GET_WEAKREFS_LISTPTR). */
  Py_ssize_t off = Py_TYPE(t)->tp_weaklistoffset;
  if (off == 0)
    return NULL;
  PyWeakReference *w = *(PyWeakReference **)((char *)t + off);
  for (; w; w = w->wr_next) {
    storage_ref_t *r = (storage_ref_t *)w;
    if (Py_TYPE(w) == &StorageRefType && r->rec && (!dp || r->data_ptr == dp))
      return r;
  }
  return NULL;
}

long cap_py_storages_cached(PyObject *t) {
  if (!ref_on(t, 0))
    return -1;
  int ok = 1;
  uint64_t dp = call_u64(t, s_data_ptr, &ok);
  if (!ok) {
    PyErr_Clear();
    return -1;
  }
  /* (the list again after a call: see "Lifetimes") */
  storage_ref_t *r = dp ? ref_on(t, dp) : NULL;
  return r ? (long)r->rec->id : -1;
}

/* The bytes of t's storage (a Python call). */
static int storage_nbytes(PyObject *t, uint64_t *nbytes) {
  PyObject *s = call0(t, s_storage);
  if (!s)
    return -1;
  int ok = 1;
  *nbytes = call_u64(s, s_nbytes, &ok);
  Py_DECREF(s);
  return ok ? 0 : -1;
}

int cap_py_storages_off_device(ClientObject *self, PyObject *t) {
  if (!self->device || self->device == Py_None)
    return 0;
  PyObject *d = PyObject_GetAttr(t, s_device);
  int same = d ? PyObject_RichCompareBool(d, self->device, Py_EQ) : -1;
  Py_XDECREF(d);
  return same < 0 ? -1 : !same;
}

int cap_py_storages_no_memory(PyObject *t) {
  int ok = 1;
  uint64_t dp = call_u64(t, s_data_ptr, &ok);
  /* Elements but no memory: a weight the plan took out, its storage
   * resized to 0 (the Python path's table finds it by its storage). */
  uint64_t n = ok && dp == 0 ? call_u64(t, s_numel, &ok) : 1;
  return ok ? dp == 0 && n == 0 : -1;
}

long cap_py_storages_id_of(ClientObject *self, PyObject *t) {
  if (Py_TYPE(t)->tp_weaklistoffset == 0) /* no list to cache in */
    return CAP_PY_ST_PYTHON;
  int ok = 1;
  uint64_t dp = call_u64(t, s_data_ptr, &ok);
  uint64_t off = ok ? call_u64(t, s_storage_offset, &ok) : 0;
  uint64_t es = ok && off ? call_u64(t, s_element_size, &ok) : 0;
  if (!ok)
    return CAP_PY_ST_ERROR;
  uint64_t base = dp - off * es;
  /* The Python side's first: a storage it holds (a weight, a buffer the
   * client brought an id back in, one it took over) is its own, and so
   * is every lookup while a weight is given up (found by its storage
   * object, not its address). */
  if (PyDict_GET_SIZE(self->gone))
    return CAP_PY_ST_PYTHON;
  PyObject *key = PyLong_FromUnsignedLongLong(base);
  if (!key)
    return CAP_PY_ST_ERROR;
  PyObject *py = PyDict_GetItemWithError(self->by_ptr, key);
  Py_DECREF(key);
  if (py)
    return CAP_PY_ST_PYTHON;
  if (PyErr_Occurred())
    return CAP_PY_ST_ERROR;
  if (!find(&self->storages, base)) {
    /* A new storage: what the Python path's _id_of checks first. */
    if (dp == 0)
      return CAP_PY_ST_UNMANAGED;
    PyObject *layout = PyObject_GetAttr(t, s_layout);
    if (!layout)
      return CAP_PY_ST_ERROR;
    int strided = layout == self->strided;
    Py_DECREF(layout);
    if (!strided)
      return CAP_PY_ST_UNMANAGED;
    int off = cap_py_storages_off_device(self, t);
    if (off)
      return off < 0 ? CAP_PY_ST_ERROR : CAP_PY_ST_UNMANAGED;
  }
  /* The reference first, as making it may run the collector. */
  PyObject *args[2] = {t, on_dead};
  PyObject *ref =
      PyObject_Vectorcall((PyObject *)&StorageRefType, args, 2, NULL);
  if (!ref)
    return CAP_PY_ST_ERROR;
  storage_ref_t *r = (storage_ref_t *)ref;
  long id = CAP_PY_ST_ERROR;
  uint64_t nbytes = 0;
  int sized = 0;
  for (;;) {
    cap_py_stor_t *s = find(&self->storages, base);
    if (s) { /* a view, or another tensor object, on a known storage */
      link_ref(s, r, dp);
      id = s->id;
      break;
    }
    if (!sized) {
      /* may run the collector: the table is looked at again after it */
      if (storage_nbytes(t, &nbytes) < 0)
        break;
      sized = 1;
      continue;
    }
    uint32_t cid;
    int rc = cap_client_adopt(self->c, nbytes, (void *)(uintptr_t)base, &cid);
    if (rc < 0) {
      cap_py_raise_rc(self, rc);
      break;
    }
    s = calloc(1, sizeof *s);
    if (!s || reserve(&self->storages) < 0) {
      free(s);
      (void)cap_client_free(self->c, cid);
      PyErr_NoMemory();
      break;
    }
    s->base = base;
    s->nbytes = nbytes;
    s->id = cid;
    s->tab = &self->storages;
    put(&self->storages, s);
    link_ref(s, r, dp);
    id = cid;
    break;
  }
  Py_DECREF(ref);
  return id;
}

/* Takes the dead list, for reporting outside the table (a free may call
 * back into Python, whose collector may add to the list meanwhile). */
static uint32_t *take_dead(cap_py_storages_t *tab, uint32_t *n) {
  uint32_t *d = tab->dead;
  *n = tab->n_dead;
  tab->dead = NULL;
  tab->n_dead = tab->cap_dead = 0;
  return d;
}

void cap_py_storages_report_dead(ClientObject *self) {
  if (!self->storages.n_dead)
    return;
  uint32_t n;
  uint32_t *d = take_dead(&self->storages, &n);
  for (uint32_t i = 0; self->c && i < n; i++) {
    /* as the Python path's _report_free: the client may know it no more */
    (void)cap_client_free(self->c, d[i]);
    if (PyErr_Occurred()) /* a release callback raised and was reported */
      PyErr_Clear();
  }
  free(d);
}

/* Every record out of the table and let go of (no Python code runs while
 * the table is walked): their ids, malloc'd, in *ids (NULL when there are
 * none, or no memory for them: those frees are lost, and counted). */
static uint32_t *release_all(cap_py_storages_t *tab, uint32_t *n) {
  *n = 0;
  uint32_t *ids = tab->n ? malloc(tab->n * sizeof *ids) : NULL;
  if (tab->n && !ids)
    tab->lost_frees += tab->n;
  for (uint32_t i = 0; i < tab->cap; i++) {
    cap_py_stor_t *s = tab->slots[i];
    if (!s)
      continue;
    tab->slots[i] = NULL;
    if (ids)
      ids[(*n)++] = s->id;
    release_rec(s);
  }
  tab->n = 0;
  return ids;
}

void cap_py_storages_disown(ClientObject *self) {
  cap_py_storages_report_dead(self);
  uint32_t n;
  uint32_t *ids = release_all(&self->storages, &n);
  for (uint32_t i = 0; self->c && i < n; i++) {
    (void)cap_client_free(self->c, ids[i]);
    if (PyErr_Occurred())
      PyErr_Clear();
  }
  free(ids);
}

void cap_py_storages_clear(ClientObject *self) {
  cap_py_storages_t *tab = &self->storages;
  uint32_t n;
  free(release_all(tab, &n));
  free(tab->slots);
  free(tab->dead);
  memset(tab, 0, sizeof *tab);
}

/* --- methods ------------------------------------------------------------ */

/* take_storage(address) -> (id, nbytes, tensors) or None: the Python side
 * takes the storage at address over, with the live tensor objects on it. */
static PyObject *Client_take_storage(ClientObject *self, PyObject *arg) {
  uint64_t base = PyLong_AsUnsignedLongLong(arg);
  if (base == (uint64_t)-1 && PyErr_Occurred())
    return NULL;
  cap_py_stor_t *s = find(&self->storages, base);
  if (!s)
    Py_RETURN_NONE;
  /* Its live objects, held, before anything is allocated (malloc runs no
   * Python code). An object that died with its callback still to come
   * (another callback on its list runs first) is left out. */
  PyObject **objs = malloc(s->nobj * sizeof *objs);
  if (!objs)
    return PyErr_NoMemory();
  uint32_t n = 0;
  for (storage_ref_t *r = s->refs; r; r = r->next) {
#if PY_VERSION_HEX >= 0x030D0000 /* 3.13 deprecates PyWeakref_GET_OBJECT */
    PyObject *o = NULL;
    if (PyWeakref_GetRef((PyObject *)r, &o) == 1)
      objs[n++] = o; /* a strong reference already */
#else
    PyObject *o = PyWeakref_GET_OBJECT((PyObject *)r);
    if (o != Py_None) {
      Py_INCREF(o);
      objs[n++] = o;
    }
#endif
  }
  if (n == 0) { /* its end is due: its callbacks report it */
    free(objs);
    Py_RETURN_NONE;
  }
  uint32_t id = s->id;
  uint64_t nbytes = s->nbytes;
  take_out(&self->storages, s);
  release_rec(s);
  PyObject *tup = PyTuple_New(n);
  if (!tup) {
    for (uint32_t i = 0; i < n; i++)
      Py_DECREF(objs[i]);
    free(objs);
    return NULL; /* (its id is lost to both sides: it is never freed) */
  }
  for (uint32_t i = 0; i < n; i++)
    PyTuple_SET_ITEM(tup, i, objs[i]);
  free(objs);
  return Py_BuildValue("(IKN)", id, (unsigned long long)nbytes, tup);
}

static PyObject *Client_flush_storages(ClientObject *self, PyObject *unused) {
  cap_py_storages_report_dead(self);
  Py_RETURN_NONE;
}

static PyObject *Client_disown_storages(ClientObject *self, PyObject *unused) {
  cap_py_storages_disown(self);
  Py_RETURN_NONE;
}

static PyObject *Client_storages_count(ClientObject *self, PyObject *unused) {
  return Py_BuildValue("(III)", self->storages.n, self->storages.n_dead,
                       self->storages.lost_frees);
}

PyMethodDef cap_py_storages_methods[] = {
    {"take_storage", (PyCFunction)Client_take_storage, METH_O,
     "take_storage(address) -> (id, nbytes, tensors) or None: the storage "
     "the per-op path adopted at address becomes the caller's"},
    {"flush_storages", (PyCFunction)Client_flush_storages, METH_NOARGS,
     "report the frees of the per-op path's storages that died"},
    {"disown_storages", (PyCFunction)Client_disown_storages, METH_NOARGS,
     "the per-op path's storages still alive leave the client (a step's "
     "end)"},
    {"storages_count", (PyCFunction)Client_storages_count, METH_NOARGS,
     "(storages in the per-op path's table, frees due, frees lost)"},
    {NULL, NULL, 0, NULL},
};
