/*
 * capuchin._client: libcapuchin-client for Python, the per-op path of the
 * PyTorch adapter (python/capuchin/). One type, Client, over one
 * cap_client_t in framework-memory mode (capuchin/framework.h): tensors are
 * adopted with the address and size of their storage, ops are reported
 * after they ran (op_run), and the client calls back into Python to
 * allocate memory for a tensor it brings back, to say a storage it evicted
 * may go, and to recompute an op.
 *
 * Everything runs on the thread that created the client (the training
 * thread) with the GIL held: the callbacks are called from within op_run,
 * acquire, poll and the iteration calls, never from another thread.
 */
#include "client_object.h" /* Python.h first, as CPython requires */

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <structmember.h>

PyObject *CapError; /* capuchin._client.Error(code, message) */

PyObject *cap_py_raise_rc(ClientObject *self, int rc) {
  const char *msg = self && self->c ? cap_client_last_error(self->c) : "";
  PyObject *args = Py_BuildValue("(iss)", rc, cap_err_name(rc),
                                 msg && *msg ? msg : cap_strerror(rc));
  if (args) {
    PyErr_SetObject(CapError, args);
    Py_DECREF(args);
  }
  return NULL;
}

static int check_open(ClientObject *self) {
  if (!self->c) {
    PyErr_SetString(PyExc_ValueError, "the client is closed");
    return -1;
  }
  return 0;
}

/* --- Callbacks from the client (owner thread, GIL held) ---------------- */

static int cb_alloc(void *user, uint32_t id, uint64_t bytes, void **dev) {
  ClientObject *self = user;
  PyObject *r = PyObject_CallFunction(self->alloc_cb, "IK", id,
                                      (unsigned long long)bytes);
  if (!r) {
    PyErr_WriteUnraisable(self->alloc_cb);
    return -1;
  }
  void *p = PyLong_AsVoidPtr(r);
  Py_DECREF(r);
  if (!p) {
    PyErr_Clear();
    return -1;
  }
  *dev = p;
  return 0;
}

static void cb_release(void *user, uint32_t id, void *dev, uint64_t bytes) {
  ClientObject *self = user;
  PyObject *p = PyLong_FromVoidPtr(dev);
  if (!p) {
    PyErr_WriteUnraisable(self->release_cb);
    return;
  }
  PyObject *r = PyObject_CallFunction(self->release_cb, "INK", id, p,
                                      (unsigned long long)bytes);
  if (!r)
    PyErr_WriteUnraisable(self->release_cb);
  Py_XDECREF(r);
}

static PyObject *id_tuple(const uint32_t *ids, uint32_t n) {
  PyObject *t = PyTuple_New(n);
  for (uint32_t i = 0; t && i < n; i++) {
    PyObject *v = PyLong_FromUnsignedLong(ids[i]);
    if (!v) {
      Py_DECREF(t);
      return NULL;
    }
    PyTuple_SET_ITEM(t, i, v);
  }
  return t;
}

static PyObject *ptr_tuple(void *const *ptrs, uint32_t n) {
  PyObject *t = PyTuple_New(n);
  for (uint32_t i = 0; t && i < n; i++) {
    PyObject *v = PyLong_FromVoidPtr(ptrs[i]);
    if (!v) {
      Py_DECREF(t);
      return NULL;
    }
    PyTuple_SET_ITEM(t, i, v);
  }
  return t;
}

/* recompute(seq, name, in_ids, in_addrs, out_ids, out_addrs) -> bool: the
 * inputs are resident at in_addrs; each output's memory at out_addrs came
 * from the adapter's alloc. */
static int cb_recompute(void *user, uint32_t seq, const char *name,
                        const uint32_t *in_ids, void *const *in_ptrs,
                        uint32_t n_in, const uint32_t *out_ids,
                        void *const *out_ptrs, uint32_t n_out) {
  ClientObject *self = user;
  PyObject *ins = id_tuple(in_ids, n_in), *outs = id_tuple(out_ids, n_out);
  PyObject *iptrs = ptr_tuple(in_ptrs, n_in), *optrs = ptr_tuple(out_ptrs, n_out);
  PyObject *r = NULL;
  if (ins && outs && iptrs && optrs)
    r = PyObject_CallFunction(self->recompute_cb, "IsOOOO", seq, name, ins,
                              iptrs, outs, optrs);
  Py_XDECREF(ins);
  Py_XDECREF(outs);
  Py_XDECREF(iptrs);
  Py_XDECREF(optrs);
  if (!r) {
    PyErr_WriteUnraisable(self->recompute_cb);
    return -1;
  }
  int ok = PyObject_IsTrue(r);
  Py_DECREF(r);
  return ok == 1 ? 0 : -1;
}

/* --- Client ---------------------------------------------------------------- */

static int Client_init(ClientObject *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"job", "budget", "socket", "no_daemon", "backend",
                           "connect_timeout_ms", "host_pool_bytes",
                           "time_scale", "alloc", "release", "recompute",
                           "compute_stream", "sim_gbps", "host_pool_cap",
                           NULL};
  const char *job = NULL, *sock = NULL, *backend = NULL;
  unsigned long long budget = 0, pool = 0;
  int no_daemon = 0;
  unsigned int timeout_ms = 1000;
  double scale = 1.0;
  PyObject *alloc = NULL, *release = NULL, *recompute = NULL;
  unsigned long long stream = 0;
  double sim_gbps = 0;
  unsigned long long pool_cap = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "|zKzpzIKdOOOKdK", kwlist, &job,
                                   &budget, &sock, &no_daemon, &backend,
                                   &timeout_ms, &pool, &scale, &alloc,
                                   &release, &recompute, &stream, &sim_gbps,
                                   &pool_cap))
    return -1;
  if (!alloc || !release || !recompute || !PyCallable_Check(alloc) ||
      !PyCallable_Check(release) || !PyCallable_Check(recompute)) {
    PyErr_SetString(PyExc_TypeError,
                    "alloc, release and recompute must be callables");
    return -1;
  }
  if (self->c) {
    PyErr_SetString(PyExc_RuntimeError, "Client.__init__ called twice");
    return -1;
  }
  cap_client_config_t cfg;
  cap_client_config_init(&cfg);
  cfg.job_name = job;
  cfg.budget_bytes = budget;
  cfg.socket_path = sock;
  cfg.no_daemon = no_daemon;
  cfg.backend = backend;
  cfg.connect_timeout_ms = timeout_ms;
  cfg.host_pool_bytes = pool;
  cfg.host_pool_cap_bytes = pool_cap;
  cfg.time_scale = scale;
  cfg.framework_memory = true;
  cfg.compute_stream = (void *)(uintptr_t)stream;
  /* sim backend: the modelled copy bandwidth in each direction (0: the
   * H100's), so a CPU run can make copies as dear as a GPU's are */
  cfg.sim_h2d_gbps = cfg.sim_d2h_gbps = sim_gbps;
  cfg.sim_duplex_gbps = sim_gbps > 0 ? 1.5 * sim_gbps : 0;
  self->names = PyDict_New();
  if (!self->names)
    return -1;
  Py_INCREF(alloc);
  Py_INCREF(release);
  Py_INCREF(recompute);
  self->alloc_cb = alloc;
  self->release_cb = release;
  self->recompute_cb = recompute;
  cap_client_t *c = NULL;
  int rc;
  Py_BEGIN_ALLOW_THREADS /* connecting may wait for the daemon */
  rc = cap_client_create(&cfg, &c);
  Py_END_ALLOW_THREADS
  if (rc < 0) {
    cap_py_raise_rc(NULL, rc);
    return -1;
  }
  self->c = c;
  cap_client_set_framework_memory(c, cb_alloc, cb_release, self);
  cap_client_set_recompute(c, cb_recompute, self);
  return 0;
}

static void Client_close_impl(ClientObject *self) {
  if (self->c) {
    cap_client_t *c = self->c;
    self->c = NULL;
    self->on = 0;
    cap_py_storages_clear(self);
    cap_client_destroy(c);
  }
}

static void Client_dealloc(ClientObject *self) {
  Client_close_impl(self);
  Py_XDECREF(self->alloc_cb);
  Py_XDECREF(self->release_cb);
  Py_XDECREF(self->recompute_cb);
  Py_XDECREF(self->names);
  cap_py_op_path_clear(self);
  cap_py_storages_clear(self);
  Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Client_close(ClientObject *self, PyObject *unused) {
  if (!cap_py_torch_alloc_keeps(self))
    Client_close_impl(self);
  Py_RETURN_NONE;
}

int cap_py_read_ids(ClientObject *self, PyObject *seq, uint32_t off,
                    uint32_t *n) {
  PyObject *f = PySequence_Fast(seq, "ids must be a sequence of ints");
  if (!f)
    return -1;
  Py_ssize_t k = PySequence_Fast_GET_SIZE(f);
  if (k > MAX_IDS) {
    Py_DECREF(f);
    PyErr_SetString(PyExc_ValueError, "more than 4096 tensors on one side");
    return -1;
  }
  PyObject **items = PySequence_Fast_ITEMS(f);
  for (Py_ssize_t i = 0; i < k; i++) {
    unsigned long v = PyLong_AsUnsignedLong(items[i]);
    if (v == (unsigned long)-1 && PyErr_Occurred()) {
      Py_DECREF(f);
      return -1;
    }
    self->ids[off + i] = (uint32_t)v;
  }
  Py_DECREF(f);
  *n = (uint32_t)k;
  return 0;
}

const char *cap_py_intern_name(ClientObject *self, PyObject *name) {
  PyObject *b = PyDict_GetItemWithError(self->names, name);
  if (!b) {
    if (PyErr_Occurred())
      return NULL;
    b = PyUnicode_AsUTF8String(name);
    if (!b)
      return NULL;
    int rc = PyDict_SetItem(self->names, name, b);
    Py_DECREF(b); /* the dict keeps it */
    if (rc < 0)
      return NULL;
  }
  return PyBytes_AS_STRING(b);
}

static PyObject *Client_adopt(ClientObject *self, PyObject *args) {
  unsigned long long bytes;
  PyObject *addr;
  if (check_open(self) < 0 || !PyArg_ParseTuple(args, "KO", &bytes, &addr))
    return NULL;
  void *p = PyLong_AsVoidPtr(addr);
  if (!p && PyErr_Occurred())
    return NULL;
  uint32_t id;
  int rc = cap_client_adopt(self->c, bytes, p, &id);
  if (rc < 0)
    return cap_py_raise_rc(self, rc);
  return PyLong_FromUnsignedLong(id);
}

static PyObject *Client_adopt_persistent(ClientObject *self, PyObject *args) {
  unsigned long long bytes;
  PyObject *addr;
  int input = 0;
  if (check_open(self) < 0 ||
      !PyArg_ParseTuple(args, "KO|p", &bytes, &addr, &input))
    return NULL;
  void *p = PyLong_AsVoidPtr(addr);
  if (!p && PyErr_Occurred())
    return NULL;
  uint32_t id;
  int rc = cap_client_adopt_persistent(
      self->c, bytes, input ? CAP_KIND_INPUT : CAP_KIND_PARAM, p, &id);
  if (rc < 0)
    return cap_py_raise_rc(self, rc);
  return PyLong_FromUnsignedLong(id);
}

static PyObject *Client_free(ClientObject *self, PyObject *arg) {
  if (check_open(self) < 0)
    return NULL;
  unsigned long id = PyLong_AsUnsignedLong(arg);
  if (id == (unsigned long)-1 && PyErr_Occurred())
    return NULL;
  int rc = cap_client_free(self->c, (uint32_t)id);
  if (PyErr_Occurred())
    PyErr_Clear();
  if (rc < 0)
    return cap_py_raise_rc(self, rc);
  Py_RETURN_NONE;
}

static PyObject *Client_acquire(ClientObject *self, PyObject *arg) {
  if (check_open(self) < 0)
    return NULL;
  unsigned long id = PyLong_AsUnsignedLong(arg);
  if (id == (unsigned long)-1 && PyErr_Occurred())
    return NULL;
  void *p = NULL;
  int rc = cap_client_acquire(self->c, (uint32_t)id, &p);
  if (PyErr_Occurred())
    PyErr_Clear();
  if (rc < 0)
    return cap_py_raise_rc(self, rc);
  return PyLong_FromVoidPtr(p);
}

static PyObject *Client_poll(ClientObject *self, PyObject *unused) {
  if (check_open(self) < 0)
    return NULL;
  int n = cap_client_poll(self->c);
  if (PyErr_Occurred())
    PyErr_Clear();
  return PyLong_FromLong(n);
}

static PyObject *Client_copying(ClientObject *self, PyObject *arg) {
  if (check_open(self) < 0)
    return NULL;
  void *p = PyLong_AsVoidPtr(arg);
  if (!p && PyErr_Occurred())
    return NULL;
  return PyBool_FromLong(cap_client_copying(self->c, p));
}

static PyObject *Client_set_evictable(ClientObject *self, PyObject *args) {
  unsigned int id;
  int yes;
  if (check_open(self) < 0 || !PyArg_ParseTuple(args, "Ip", &id, &yes))
    return NULL;
  int rc = cap_client_set_evictable(self->c, id, yes);
  if (rc < 0)
    return cap_py_raise_rc(self, rc);
  Py_RETURN_NONE;
}

static PyObject *Client_set_device_timeline(ClientObject *self,
                                            PyObject *args) {
  int on;
  if (check_open(self) < 0 || !PyArg_ParseTuple(args, "p", &on))
    return NULL;
  int rc = cap_client_set_device_timeline(self->c, on);
  if (rc < 0)
    return cap_py_raise_rc(self, rc);
  Py_RETURN_NONE;
}

static PyObject *Client_make_room(ClientObject *self, PyObject *unused) {
  if (check_open(self) < 0)
    return NULL;
  int r = cap_client_make_room(self->c);
  if (PyErr_Occurred())
    PyErr_Clear();
  return PyBool_FromLong(r > 0);
}

static PyObject *Client_resident(ClientObject *self, PyObject *arg) {
  if (check_open(self) < 0)
    return NULL;
  unsigned long id = PyLong_AsUnsignedLong(arg);
  if (id == (unsigned long)-1 && PyErr_Occurred())
    return NULL;
  int r = cap_client_tensor_resident(self->c, (uint32_t)id);
  if (r < 0)
    return cap_py_raise_rc(self, r);
  return PyBool_FromLong(r);
}

static PyObject *Client_begin(ClientObject *self, PyObject *unused) {
  if (check_open(self) < 0)
    return NULL;
  int rc = cap_client_iteration_begin(self->c);
  if (PyErr_Occurred())
    PyErr_Clear();
  if (rc < 0)
    return cap_py_raise_rc(self, rc);
  cap_py_op_path_begin(self, cap_client_mode(self->c));
  return PyUnicode_FromString(cap_client_mode_name(cap_client_mode(self->c)));
}

static PyObject *Client_diverged(ClientObject *self, PyObject *unused) {
  if (check_open(self) < 0)
    return NULL;
  /* the adapter stopped reporting: this op sequence is not a whole one */
  cap_py_op_path_stopped(self);
  int rc = cap_client_diverged(self->c);
  if (rc < 0)
    return cap_py_raise_rc(self, rc);
  Py_RETURN_NONE;
}

static PyObject *Client_end(ClientObject *self, PyObject *unused) {
  if (check_open(self) < 0)
    return NULL;
  cap_iter_stats_t s;
  int rc = cap_client_iteration_end(self->c, &s);
  if (PyErr_Occurred())
    PyErr_Clear();
  self->on = 0;
  if (rc < 0)
    return cap_py_raise_rc(self, rc);
  cap_py_op_path_end(self, s.mode);
  return Py_BuildValue(
      "{s:I,s:s,s:L,s:K,s:K,s:K,s:I,s:I,s:I,s:L,s:I,s:I,s:I,s:s,s:I,s:s,s:I,"
      "s:I,s:I,s:I}",
      "iteration", s.iteration, "mode", cap_client_mode_name(s.mode), "time_ns",
      (long long)s.time_ns, "peak_bytes", (unsigned long long)s.peak_bytes,
      "bytes_out", (unsigned long long)s.bytes_out, "bytes_in",
      (unsigned long long)s.bytes_in, "evictions", s.evictions,
      "recomputed_ops", s.recomputed_ops, "stalls", s.stalls, "stall_ns",
      (long long)s.stall_ns, "plan_version", s.plan_version, "fallbacks",
      s.fallbacks, "op_errors", s.op_errors, "first_error", s.first_error,
      "refused_actions", s.refused_actions, "plan_note", s.plan_note,
      "placed_allocs", s.placed_allocs, "placement_misses", s.placement_misses,
      "peak_op", s.peak_op, "over_budget_allocs", s.over_budget_allocs);
}

static PyObject *Client_stats(ClientObject *self, PyObject *unused) {
  if (check_open(self) < 0)
    return NULL;
  cap_client_stats_t s;
  cap_client_get_stats(self->c, &s);
  return Py_BuildValue(
      "{s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:I,s:I,s:O,s:I,s:s,s:K,s:s,s:d,s:d}",
      "bytes_out", (unsigned long long)s.bytes_out, "bytes_in",
      (unsigned long long)s.bytes_in, "evictions",
      (unsigned long long)s.evictions, "recomputed_ops",
      (unsigned long long)s.recomputed_ops, "peak_bytes",
      (unsigned long long)s.peak_bytes, "device_bytes",
      (unsigned long long)s.device_bytes, "budget_bytes",
      (unsigned long long)s.budget_bytes, "plan_version", s.plan_version,
      "iterations", s.iterations, "connected",
      s.connected ? Py_True : Py_False, "reconnects", s.reconnects, "backend",
      s.backend, "min_budget_bytes", (unsigned long long)s.min_budget_bytes,
      "daemon_message", s.daemon_message, "h2d_gbps", s.h2d_gbps, "d2h_gbps",
      s.d2h_gbps);
}

static PyObject *Client_wait_plan(ClientObject *self, PyObject *args) {
  unsigned int version, timeout_ms;
  if (check_open(self) < 0 ||
      !PyArg_ParseTuple(args, "II", &version, &timeout_ms))
    return NULL;
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = cap_client_wait_plan(self->c, version, timeout_ms);
  Py_END_ALLOW_THREADS
  return PyLong_FromLong(rc);
}

static PyObject *Client_now_ns(ClientObject *self, PyObject *unused) {
  if (check_open(self) < 0)
    return NULL;
  return PyLong_FromLongLong(cap_client_now_ns(self->c));
}

static PyObject *Client_last_error(ClientObject *self, PyObject *unused) {
  return PyUnicode_FromString(self->c ? cap_client_last_error(self->c) : "");
}

static PyMethodDef Client_methods[] = {
    {"adopt", (PyCFunction)Client_adopt, METH_VARARGS,
     "adopt(nbytes, address) -> id: a transient tensor the framework holds"},
    {"adopt_persistent", (PyCFunction)Client_adopt_persistent, METH_VARARGS,
     "adopt_persistent(nbytes, address, input=False) -> id"},
    {"free", (PyCFunction)Client_free, METH_O, "free(id)"},
    {"acquire", (PyCFunction)Client_acquire, METH_O,
     "acquire(id) -> address: bring a tensor back for an unpack hook"},
    {"poll", (PyCFunction)Client_poll, METH_NOARGS,
     "poll() -> copies still running (finished ones are released)"},
    {"resident", (PyCFunction)Client_resident, METH_O, "resident(id) -> bool"},
    {"copying", (PyCFunction)Client_copying, METH_O,
     "copying(address) -> bool: a copy still uses that memory (release to "
     "come)"},
    {"set_evictable", (PyCFunction)Client_set_evictable, METH_VARARGS,
     "set_evictable(id, bool): the adapter can give up and take back the "
     "memory of persistent tensor id (capuchin/framework.h)"},
    {"set_device_timeline", (PyCFunction)Client_set_device_timeline,
     METH_VARARGS,
     "set_device_timeline(bool): op durations are device times; the host's "
     "time between ops stays out of the measured timeline "
     "(capuchin/framework.h)"},
    {"make_room", (PyCFunction)Client_make_room, METH_NOARGS,
     "make_room() -> bool: wait for swap-outs while over the budget"},
    {"begin", (PyCFunction)Client_begin, METH_NOARGS,
     "iteration begin -> its mode: 'measured', 'guided' or 'passive'"},
    {"end", (PyCFunction)Client_end, METH_NOARGS, "iteration end -> dict"},
    {"diverged", (PyCFunction)Client_diverged, METH_NOARGS,
     "the iteration left the plan's op sequence"},
    {"stats", (PyCFunction)Client_stats, METH_NOARGS, "counters -> dict"},
    {"wait_plan", (PyCFunction)Client_wait_plan, METH_VARARGS,
     "wait_plan(version, timeout_ms) -> 0 or a CAP_E* code"},
    {"now_ns", (PyCFunction)Client_now_ns, METH_NOARGS, "backend clock"},
    {"last_error", (PyCFunction)Client_last_error, METH_NOARGS, ""},
    {"close", (PyCFunction)Client_close, METH_NOARGS, "destroy the client"},
    {NULL, NULL, 0, NULL},
};

/* The per-op path's state the adapter reads and sets (op_path.c). */
static PyMemberDef Client_members[] = {
    {"on", T_INT, offsetof(ClientObject, on), 0,
     "a reported step: dispatch may handle ops itself"},
    {"diverged_at", T_INT, offsetof(ClientObject, diverged_at), READONLY,
     "op seq where this guided iteration left the plan's ops, -1: it has not"},
    {"op_seq", T_UINT, offsetof(ClientObject, op_seq), READONLY,
     "ops reported this iteration"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject ClientType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "capuchin._client.Client",
    .tp_basicsize = sizeof(ClientObject),
    .tp_dealloc = (destructor)Client_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "libcapuchin-client in framework-memory mode",
    .tp_methods = Client_methods,
    .tp_members = Client_members,
    .tp_init = (initproc)Client_init,
    .tp_new = PyType_GenericNew,
};

static PyObject *mod_socket_path(PyObject *m, PyObject *args) {
  const char *sock = NULL;
  if (!PyArg_ParseTuple(args, "|z", &sock))
    return NULL;
  cap_client_config_t cfg;
  cap_client_config_init(&cfg);
  cfg.socket_path = sock;
  char buf[256];
  if (cap_client_socket_path(&cfg, buf, sizeof buf) < 0)
    return cap_py_raise_rc(NULL, CAP_ERANGE);
  return PyUnicode_FromString(buf);
}

static PyMethodDef mod_methods[] = {
    {"socket_path", mod_socket_path, METH_VARARGS,
     "socket_path(path=None): the daemon socket the client would use"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moddef = {
    PyModuleDef_HEAD_INIT, "capuchin._client",
    "libcapuchin-client bindings (see capuchin/framework.h)", -1, mod_methods,
    NULL, NULL, NULL, NULL,
};

static int add_methods(PyMethodDef *md) {
  for (; md->ml_name; md++) {
    PyObject *d = PyDescr_NewMethod(&ClientType, md);
    int rc = d ? PyDict_SetItemString(ClientType.tp_dict, md->ml_name, d) : -1;
    Py_XDECREF(d);
    if (rc < 0)
      return -1;
  }
  return 0;
}

PyMODINIT_FUNC PyInit__client(void) {
  if (PyType_Ready(&ClientType) < 0)
    return NULL;
  /* The per-op path's methods live in op_path.c and storages.c, the CUDA
   * allocator's in torch_alloc.c. */
  if (cap_py_storages_ready() < 0 || add_methods(cap_py_op_path_methods) < 0 ||
      add_methods(cap_py_storages_methods) < 0 ||
      add_methods(cap_py_torch_alloc_methods) < 0)
    return NULL;
  PyType_Modified(&ClientType);
  PyObject *m = PyModule_Create(&moddef);
  if (!m)
    return NULL;
  CapError = PyErr_NewException("capuchin._client.Error", PyExc_RuntimeError,
                                NULL);
  Py_INCREF(&ClientType);
  if (!CapError || PyModule_AddObject(m, "Error", CapError) < 0 ||
      PyModule_AddObject(m, "Client", (PyObject *)&ClientType) < 0) {
    Py_DECREF(m);
    return NULL;
  }
  Py_INCREF(CapError);
  return m;
}
