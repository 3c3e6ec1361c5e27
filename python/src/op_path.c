/*
 * The adapter's per-op path in C: Client.dispatch is the reported step's
 * TorchDispatchMode handler itself, so that an ordinary op costs one C
 * call: the ids of its tensors from what the adapter cached on each tensor
 * object, the op run and timed, its report (op_run), and the check that a
 * guided iteration still follows the plan's op sequence. A new output
 * storage is adopted here and its free reported here (storages.c); frees
 * and work of the Python side due before the op are done by its flush,
 * and the op stays here. Whatever is not ordinary (an input seen for the
 * first time, nested or keyword tensor arguments, an op the plan may
 * replay, the adapter's own ops) goes to the adapter's Python path,
 * slow(func, args, kwargs), which reports through Client.op: the sequence
 * check and the report are here only, for both.
 *
 * The cache on a tensor object is one of two things. A StorageRef of
 * storages.c (a storage this path adopted) on its weak reference list: it
 * holds while its record does and the tensor's data_ptr() is the one it
 * noted. Or, in its __dict__, _cap_st, a Storage record of the Python
 * side (python/capuchin/_tensors.py, _track), with _cap_dp, the tensor's
 * data_ptr() then: used only while the data_ptr() is still that and the
 * Python side's table still maps the record's address to it; the
 * record's ident holds the id.
 */
#include "client_object.h" /* Python.h first, as CPython requires */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static PyObject *s_cap_st, *s_cap_dp, *s_data_ptr, *s_ptr, *s_ident, *s_id;
static PyObject *empty_args;

static int intern_strings(void) {
  if (s_id)
    return 0;
  s_cap_st = PyUnicode_InternFromString("_cap_st");
  s_cap_dp = PyUnicode_InternFromString("_cap_dp");
  s_data_ptr = PyUnicode_InternFromString("data_ptr");
  s_ptr = PyUnicode_InternFromString("ptr");
  s_ident = PyUnicode_InternFromString("ident");
  s_id = PyUnicode_InternFromString("id");
  empty_args = PyTuple_New(0);
  return s_cap_st && s_cap_dp && s_data_ptr && s_ptr && s_ident && s_id &&
                 empty_args
             ? 0
             : -1;
}

/* --- The op sequence -------------------------------------------------------- */

static void sig_reset(op_sig_t *s) {
  s->n_ops = 0;
  s->n_ids = 0;
}

static void sig_free(op_sig_t *s) {
  free(s->ops);
  free(s->ids);
  memset(s, 0, sizeof *s);
}

static int sig_add(op_sig_t *s, const char *name, const uint32_t *in,
                   uint32_t n_in, const uint32_t *out, uint32_t n_out) {
  if (s->n_ops == s->cap_ops) {
    uint32_t n = s->cap_ops ? 2 * s->cap_ops : 1024;
    op_sig_op_t *ops = realloc(s->ops, (size_t)n * sizeof *ops);
    if (!ops)
      return -1;
    s->ops = ops;
    s->cap_ops = n;
  }
  if (s->cap_ids - s->n_ids < n_in + n_out) {
    uint32_t n = s->cap_ids ? s->cap_ids : 4096;
    while (n - s->n_ids < n_in + n_out)
      n *= 2;
    uint32_t *ids = realloc(s->ids, (size_t)n * sizeof *ids);
    if (!ids)
      return -1;
    s->ids = ids;
    s->cap_ids = n;
  }
  s->ops[s->n_ops++] = (op_sig_op_t){name, s->n_ids, n_in, n_out};
  memcpy(s->ids + s->n_ids, in, n_in * sizeof *in);
  memcpy(s->ids + s->n_ids + n_in, out, n_out * sizeof *out);
  s->n_ids += n_in + n_out;
  return 0;
}

static int sig_matches(const op_sig_t *s, uint32_t seq, const char *name,
                       const uint32_t *in, uint32_t n_in, const uint32_t *out,
                       uint32_t n_out) {
  if (seq >= s->n_ops)
    return 0;
  const op_sig_op_t *o = &s->ops[seq];
  return o->name == name && o->n_in == n_in && o->n_out == n_out &&
         !memcmp(s->ids + o->off, in, n_in * sizeof *in) &&
         !memcmp(s->ids + o->off + n_in, out, n_out * sizeof *out);
}

static void print_op(FILE *f, const char *name, const uint32_t *in,
                     uint32_t n_in, const uint32_t *out, uint32_t n_out) {
  fprintf(f, "%s(", name);
  for (uint32_t i = 0; i < n_in; i++)
    fprintf(f, "%s%u", i ? " " : "", in[i]);
  fprintf(f, " ->");
  for (uint32_t i = 0; i < n_out; i++)
    fprintf(f, " %u", out[i]);
  fprintf(f, ")");
}

/* CAPUCHIN_DEBUG_OPS=PREFIX: every op reported, and every iteration's
 * beginning, in PREFIX.PID, for reading a run's op sequences side by side
 * afterwards (a guided step that leaves its plan on a machine one cannot
 * log in to). NULL when unset or unwritable. */
static FILE *ops_log(void) {
  static FILE *f;
  static int opened;
  if (!opened) {
    opened = 1;
    const char *prefix = getenv("CAPUCHIN_DEBUG_OPS");
    if (prefix && *prefix) {
      char path[4096];
      snprintf(path, sizeof path, "%s.%ld", prefix, (long)getpid());
      f = fopen(path, "w");
      if (f) /* line by line: the run may end in a crash */
        setvbuf(f, NULL, _IOLBF, 0);
    }
  }
  return f;
}

/* CAPUCHIN_DEBUG: which op left the plan's sequence, and how (name, ids,
 * or the same name under another string: names compare as pointers). */
static void print_divergence(const op_sig_t *s, uint32_t seq, const char *name,
                             const uint32_t *in, uint32_t n_in,
                             const uint32_t *out, uint32_t n_out) {
  fprintf(stderr, "capuchin: diverged at op %u: ran ", seq);
  print_op(stderr, name, in, n_in, out, n_out);
  if (seq < s->n_ops) {
    const op_sig_op_t *o = &s->ops[seq];
    fprintf(stderr, ", the plan's ");
    print_op(stderr, o->name, s->ids + o->off, o->n_in,
             s->ids + o->off + o->n_in, o->n_out);
    if (o->name != name && !strcmp(o->name, name))
      fprintf(stderr, " (the same name, another string)");
  } else {
    fprintf(stderr, ", past the plan's %u ops", s->n_ops);
  }
  fprintf(stderr, "\n");
}

void cap_py_op_path_begin(ClientObject *self, cap_mode_t mode) {
  self->mode = mode;
  self->op_seq = 0;
  self->diverged_at = -1;
  self->cur_ok = 1;
  sig_reset(&self->cur);
  FILE *log = ops_log();
  if (log)
    fprintf(log, "begin %s\n", cap_client_mode_name(mode));
}

void cap_py_op_path_end(ClientObject *self, cap_mode_t mode) {
  self->on = 0;
  if (mode == CAP_MODE_MEASURED && self->cur_ok) {
    op_sig_t t = self->plan;
    self->plan = self->cur;
    self->cur = t;
  }
}

void cap_py_op_path_stopped(ClientObject *self) { self->cur_ok = 0; }

void cap_py_op_path_clear(ClientObject *self) {
  sig_free(&self->cur);
  sig_free(&self->plan);
  Py_CLEAR(self->slow);
  Py_CLEAR(self->id_of);
  Py_CLEAR(self->stop);
  Py_CLEAR(self->by_ptr);
  Py_CLEAR(self->watch);
  Py_CLEAR(self->flush);
  Py_CLEAR(self->give_up);
  Py_CLEAR(self->tensor_type);
  Py_CLEAR(self->slow_funcs);
  Py_CLEAR(self->func_names);
  Py_CLEAR(self->gone);
  Py_CLEAR(self->strided);
  Py_CLEAR(self->device);
  self->fast_adopt = 0;
}

/* The op's ids are in self->ids (inputs) and self->ids + MAX_IDS (outputs).
 * A guided iteration that leaves the plan's op sequence stops the plan
 * (cap_client_diverged) before the op is reported. 0, or -1 with
 * capuchin._client.Error set. */
static int report(ClientObject *self, char path, const char *name,
                  uint32_t n_in, uint32_t n_out, int64_t dur_ns) {
  const uint32_t *in = self->ids, *out = self->ids + MAX_IDS;
  uint32_t seq = self->op_seq++;
  FILE *log = ops_log();
  if (log) { /* path: C, or P for the Python path */
    fprintf(log, "%u %c %lld ", seq, path, (long long)dur_ns);
    print_op(log, name, in, n_in, out, n_out);
    fputc('\n', log);
  }
  if (self->mode == CAP_MODE_MEASURED && self->cur_ok &&
      sig_add(&self->cur, name, in, n_in, out, n_out) < 0)
    self->cur_ok = 0; /* out of memory: no plan signature from it */
  if (self->mode == CAP_MODE_GUIDED && self->diverged_at < 0 &&
      !sig_matches(&self->plan, seq, name, in, n_in, out, n_out)) {
    self->diverged_at = (int)seq;
    if (getenv("CAPUCHIN_DEBUG"))
      print_divergence(&self->plan, seq, name, in, n_in, out, n_out);
    (void)cap_client_diverged(self->c);
  }
  int rc = cap_client_op_run(self->c, name, in, n_in, out, n_out,
                             dur_ns < 0 ? 0 : dur_ns);
  if (PyErr_Occurred()) /* a callback raised and was reported */
    PyErr_Clear();
  if (rc < 0) {
    cap_py_raise_rc(self, rc);
    return -1;
  }
  return 0;
}

/* op(name, in_ids, out_ids, duration_ns): an op that has run (the Python
 * path's report). */
static PyObject *Client_op(ClientObject *self, PyObject *const *args,
                           Py_ssize_t nargs) {
  if (!self->c) {
    PyErr_SetString(PyExc_ValueError, "the client is closed");
    return NULL;
  }
  if (nargs != 4 || !PyUnicode_Check(args[0])) {
    PyErr_SetString(PyExc_TypeError, "op(name, in_ids, out_ids, duration_ns)");
    return NULL;
  }
  const char *name = cap_py_intern_name(self, args[0]);
  uint32_t n_in = 0, n_out = 0;
  if (!name || cap_py_read_ids(self, args[1], 0, &n_in) < 0 ||
      cap_py_read_ids(self, args[2], MAX_IDS, &n_out) < 0)
    return NULL;
  long long dur = PyLong_AsLongLong(args[3]);
  if (dur == -1 && PyErr_Occurred())
    return NULL;
  if (report(self, 'P', name, n_in, n_out, dur) < 0)
    return NULL;
  Py_RETURN_NONE;
}

/* --- dispatch ---------------------------------------------------------------- */

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* The id the Python side's record cached on tensor t, or -1 when there is
 * none that still holds. */
static long py_cached_id(ClientObject *self, PyObject *t) {
  PyObject **dp = _PyObject_GetDictPtr(t);
  if (!dp || !*dp)
    return -1;
  PyObject *st = PyDict_GetItemWithError(*dp, s_cap_st);
  PyObject *cached_ptr = st ? PyDict_GetItemWithError(*dp, s_cap_dp) : NULL;
  if (!cached_ptr)
    goto miss;
  PyObject *ptr =
      PyObject_VectorcallMethod(s_data_ptr, &t, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET,
                                NULL);
  if (!ptr)
    goto miss;
  int same = PyObject_RichCompareBool(ptr, cached_ptr, Py_EQ);
  Py_DECREF(ptr);
  if (same != 1)
    goto miss;
  long id = -1;
  PyObject *base = PyObject_GetAttr(st, s_ptr);
  if (base && PyDict_GetItemWithError(self->by_ptr, base) == st) {
    PyObject *ident = PyObject_GetAttr(st, s_ident);
    PyObject *v = ident ? PyObject_GetAttr(ident, s_id) : NULL;
    id = v ? PyLong_AsLong(v) : -1;
    Py_XDECREF(v);
    Py_XDECREF(ident);
  }
  Py_XDECREF(base);
  if (id >= 0 && id <= (long)UINT32_MAX)
    return id;
miss:
  PyErr_Clear();
  return -1;
}

/* The Python side's record first: a tensor object it tracks may carry
 * many weak references (one per time it was tracked again), which the C
 * table's look-up walks. */
static long cached_id(ClientObject *self, PyObject *t) {
  long id = py_cached_id(self, t);
  return id >= 0 ? id : cap_py_storages_cached(t);
}

static int add_unique(uint32_t *ids, uint32_t *n, uint32_t id) {
  for (uint32_t i = 0; i < *n; i++)
    if (ids[i] == id)
      return 0;
  if (*n == MAX_IDS)
    return -1;
  ids[(*n)++] = id;
  return 0;
}

/* The interned name of func, NULL for an op that always takes the slow
 * path (and on errors, cleared: the slow path reports them). */
static const char *func_name(ClientObject *self, PyObject *func) {
  PyObject *b = PyDict_GetItemWithError(self->func_names, func);
  if (b)
    return b == Py_None ? NULL : PyBytes_AS_STRING(b);
  if (PyErr_Occurred())
    goto fail;
  int slow = PySet_Contains(self->slow_funcs, func);
  if (slow < 0)
    goto fail;
  const char *name = NULL;
  if (!slow) {
    PyObject *s = PyObject_Str(func);
    if (!s)
      goto fail;
    name = cap_py_intern_name(self, s);
    b = name ? PyDict_GetItemWithError(self->names, s) : NULL;
    Py_DECREF(s);
    if (!b)
      goto fail;
  }
  if (PyDict_SetItem(self->func_names, func, slow ? Py_None : b) < 0)
    goto fail;
  return name;
fail:
  PyErr_Clear();
  return NULL;
}

/* The ids of the tensors in an op's output (a tensor, or a tuple or list
 * of them, nested once), adopting storages seen the first time through the
 * Python path's id_of. 0, or -1 with an exception set. */
static int out_ids(ClientObject *self, PyObject *o, uint32_t *n, int depth) {
  if (PyObject_TypeCheck(o, (PyTypeObject *)self->tensor_type)) {
    long id = cached_id(self, o);
    if (id < 0 && self->fast_adopt) {
      id = cap_py_storages_id_of(self, o);
      if (id == CAP_PY_ST_ERROR)
        return -1;
      if (id == CAP_PY_ST_UNMANAGED)
        return 0;
    }
    if (id < 0) {
      PyObject *v = PyObject_CallOneArg(self->id_of, o);
      if (!v)
        return -1;
      id = v == Py_None ? -1 : PyLong_AsLong(v);
      Py_DECREF(v);
      if (id == -1 && PyErr_Occurred())
        return -1;
      if (id < 0)
        return 0; /* not a strided storage: not managed */
    }
    if (add_unique(self->ids + MAX_IDS, n, (uint32_t)id) < 0) {
      PyErr_SetString(PyExc_ValueError, "more than 4096 output tensors");
      return -1;
    }
    return 0;
  }
  if (depth < 2 && (PyTuple_Check(o) || PyList_Check(o))) {
    PyObject *f = PySequence_Fast(o, "");
    if (!f)
      return -1;
    int rc = 0;
    for (Py_ssize_t i = 0; rc == 0 && i < PySequence_Fast_GET_SIZE(f); i++)
      rc = out_ids(self, PySequence_Fast_GET_ITEM(f, i), n, depth + 1);
    Py_DECREF(f);
    return rc;
  }
  return 0;
}

/* The inputs' ids, when every tensor argument is a positional one with a
 * cached id; 0 when the op must take the slow path. */
static int in_ids(ClientObject *self, PyObject *args, uint32_t *n) {
  PyTypeObject *tt = (PyTypeObject *)self->tensor_type;
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(args); i++) {
    PyObject *a = PyTuple_GET_ITEM(args, i);
    if (PyObject_TypeCheck(a, tt)) {
      long id = cached_id(self, a);
      if (id < 0) {
        /* Not the job's memory, as in the Python path, which new storages
         * are left to: off the job's device (a CUDA job's CPU scalar), or
         * no memory at all (an empty tensor: cuDNN's batch norm reserve
         * space, which every cudnn_batch_norm_backward reads). */
        int off = cap_py_storages_off_device(self, a);
        if (off == 0)
          off = cap_py_storages_no_memory(a);
        if (off > 0)
          continue;
        PyErr_Clear();
        return 0;
      }
      if (add_unique(self->ids, n, (uint32_t)id) < 0)
        return 0;
    } else if (PyTuple_Check(a) || PyList_Check(a)) {
      /* a list of tensors (cat, stack): the Python path flattens it */
      PyObject *f = PySequence_Fast(a, "");
      if (!f)
        return 0;
      int plain = 1;
      for (Py_ssize_t k = 0; plain && k < PySequence_Fast_GET_SIZE(f); k++)
        plain = !PyObject_TypeCheck(PySequence_Fast_GET_ITEM(f, k), tt);
      Py_DECREF(f);
      if (!plain)
        return 0;
    } else if (PyDict_Check(a)) {
      return 0;
    }
  }
  return 1;
}

static int work_due(ClientObject *self) {
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(self->watch); i++)
    if (PyList_GET_SIZE(PyTuple_GET_ITEM(self->watch, i)))
      return 1;
  return 0;
}

static PyObject *slow_path(ClientObject *self, PyObject *func, PyObject *args,
                           PyObject *kwargs) {
  PyObject *kw = kwargs && kwargs != Py_None ? kwargs : NULL;
  PyObject *owned = NULL;
  if (!kw)
    kw = owned = PyDict_New();
  PyObject *r = kw ? PyObject_CallFunctionObjArgs(self->slow, func, args, kw,
                                                  NULL)
                   : NULL;
  Py_XDECREF(owned);
  return r;
}

/* The client refused something (capuchin._client.Error is set): the step
 * stops reporting, as the Python path's _dispatch does. 0, or -1 with an
 * exception set (another error, which propagates). */
static int stop_on_client_error(ClientObject *self) {
  if (!PyErr_ExceptionMatches(CapError))
    return -1;
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  PyObject *why = value ? PyObject_Str(value) : NULL;
  PyObject *r = why ? PyObject_CallOneArg(self->stop, why) : NULL;
  Py_XDECREF(why);
  Py_XDECREF(type);
  Py_XDECREF(value);
  Py_XDECREF(tb);
  if (!r)
    return -1;
  Py_DECREF(r);
  return 0;
}

/* The op has run and returned out, but could not be reported. */
static PyObject *report_failed(ClientObject *self, PyObject *out) {
  if (stop_on_client_error(self) < 0) {
    Py_DECREF(out);
    return NULL;
  }
  return out;
}

/* dispatch(func, types, args=(), kwargs=None): the TorchDispatchMode
 * handler of a reported step. */
static PyObject *Client_dispatch(ClientObject *self, PyObject *const *a,
                                 Py_ssize_t nargs) {
  if (nargs < 2 || nargs > 4) {
    PyErr_SetString(PyExc_TypeError, "dispatch(func, types, args=(), kwargs=None)");
    return NULL;
  }
  if (!self->slow) {
    PyErr_SetString(PyExc_RuntimeError, "dispatch before set_op_path");
    return NULL;
  }
  PyObject *func = a[0];
  PyObject *args = nargs > 2 ? a[2] : NULL;
  PyObject *kwargs = nargs > 3 ? a[3] : NULL;
  /* The frees of the storages this path adopted (never the Python path's
   * business) first, as any free is reported before the next op. */
  if (self->on)
    cap_py_storages_report_dead(self);
  /* Frees from the ops before (most ops free something) are reported
   * first, as the Python path would, and the op stays on this path. If
   * the client refuses one, the step stops reporting and the op runs
   * unreported (the slow path sees it stopped). */
  if (self->on && work_due(self)) {
    PyObject *r = PyObject_CallNoArgs(self->flush);
    if (!r) {
      if (stop_on_client_error(self) < 0)
        return NULL;
      return slow_path(self, func, args ? args : empty_args, kwargs);
    }
    Py_DECREF(r);
  }
  int plain = self->on && self->c && args && PyTuple_Check(args) &&
              (!kwargs || kwargs == Py_None ||
               (PyDict_Check(kwargs) && PyDict_GET_SIZE(kwargs) == 0));
  const char *name = plain ? func_name(self, func) : NULL;
  if (!name)
    return slow_path(self, func, args ? args : empty_args, kwargs);
  if (self->mode == CAP_MODE_GUIDED && self->diverged_at < 0) {
    /* The Python path records the arguments of an op a recompute list
     * may replay. */
    if (cap_client_op_replayed(self->c, self->op_seq))
      return slow_path(self, func, args, kwargs);
    /* PyTorch allocates the outputs as the op runs: room first. */
    (void)cap_client_make_room(self->c);
    if (PyErr_Occurred()) /* a release callback raised and was reported */
      PyErr_Clear();
  }
  /* Released weights (make_room may have released one, whose swap-out
   * ended, and it may be this op's input) are for the slow path, which
   * brings such a weight back first. */
  if (PyList_GET_SIZE(self->give_up))
    return slow_path(self, func, args, kwargs);
  uint32_t n_in = 0;
  if (!in_ids(self, args, &n_in))
    return slow_path(self, func, args, kwargs);
  int64_t t0 = now_ns();
  PyObject *out = PyObject_Call(func, args, NULL);
  int64_t dur = now_ns() - t0;
  if (!out)
    return NULL;
  uint32_t n_out = 0;
  if (out_ids(self, out, &n_out, 0) < 0 ||
      report(self, 'C', name, n_in, n_out, dur) < 0)
    return report_failed(self, out);
  return out;
}

/* set_op_path(slow, id_of, stop, by_ptr, watch, flush, give_up,
 * tensor_type, slow_funcs, gone, strided, fast_adopt): what dispatch needs
 * of the adapter (see client_object.h). */
static PyObject *Client_set_op_path(ClientObject *self, PyObject *args) {
  PyObject *slow, *id_of, *stop, *by_ptr, *watch, *flush, *give_up, *tt, *sf;
  PyObject *gone, *strided, *device;
  int fast_adopt;
  if (!PyArg_ParseTuple(args, "OOOO!O!OO!O!O!O!OpO", &slow, &id_of, &stop,
                        &PyDict_Type, &by_ptr, &PyTuple_Type, &watch, &flush,
                        &PyList_Type, &give_up, &PyType_Type, &tt,
                        &PyFrozenSet_Type, &sf, &PyDict_Type, &gone, &strided,
                        &fast_adopt, &device))
    return NULL;
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(watch); i++)
    if (!PyList_Check(PyTuple_GET_ITEM(watch, i))) {
      PyErr_SetString(PyExc_TypeError, "watch: a tuple of lists");
      return NULL;
    }
  if (!PyCallable_Check(slow) || !PyCallable_Check(id_of) ||
      !PyCallable_Check(stop) || !PyCallable_Check(flush)) {
    PyErr_SetString(PyExc_TypeError,
                    "slow, id_of, stop and flush must be callables");
    return NULL;
  }
  if (intern_strings() < 0 || cap_py_storages_set_torch(tt) < 0)
    return NULL;
  PyObject *names = PyDict_New();
  if (!names)
    return NULL;
  PyObject *objs[] = {slow,    id_of, stop, by_ptr, watch,   flush,
                      give_up, tt,    sf,   gone,   strided, device};
  for (size_t i = 0; i < sizeof objs / sizeof *objs; i++)
    Py_INCREF(objs[i]);
  Py_XSETREF(self->slow, slow);
  Py_XSETREF(self->id_of, id_of);
  Py_XSETREF(self->stop, stop);
  Py_XSETREF(self->by_ptr, by_ptr);
  Py_XSETREF(self->watch, watch);
  Py_XSETREF(self->flush, flush);
  Py_XSETREF(self->give_up, give_up);
  Py_XSETREF(self->tensor_type, tt);
  Py_XSETREF(self->slow_funcs, sf);
  Py_XSETREF(self->func_names, names);
  Py_XSETREF(self->gone, gone);
  Py_XSETREF(self->strided, strided);
  Py_XSETREF(self->device, device);
  self->fast_adopt = fast_adopt;
  Py_RETURN_NONE;
}

static PyObject *Client_replayed(ClientObject *self, PyObject *arg) {
  unsigned long seq = PyLong_AsUnsignedLong(arg);
  if (seq == (unsigned long)-1 && PyErr_Occurred())
    return NULL;
  return PyBool_FromLong(self->c && seq <= UINT32_MAX &&
                         cap_client_op_replayed(self->c, (uint32_t)seq));
}

PyMethodDef cap_py_op_path_methods[] = {
    {"dispatch", (PyCFunction)(void (*)(void))Client_dispatch, METH_FASTCALL,
     "dispatch(func, types, args=(), kwargs=None): a reported step's "
     "TorchDispatchMode handler"},
    {"op", (PyCFunction)(void (*)(void))Client_op, METH_FASTCALL,
     "op(name, in_ids, out_ids, duration_ns): report an op that has run"},
    {"set_op_path", (PyCFunction)Client_set_op_path, METH_VARARGS,
     "set_op_path(slow, id_of, stop, by_ptr, watch, flush, give_up, "
     "tensor_type, slow_funcs, gone, strided, fast_adopt, device)"},
    {"replayed", (PyCFunction)Client_replayed, METH_O,
     "replayed(seq) -> bool: a recompute list of the plan may replay op seq"},
    {NULL, NULL, 0, NULL},
};
