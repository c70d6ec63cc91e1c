/* The compiled fast path of ``Tracer.op`` (laggard.tracer.core): the common op, a known compute
 * op timed on the CPU inside a step, costs two Python calls and a struct.pack_into in the pure
 * Python path (~1 us on a 2-core VM); here it is one C call to start it and one to end it.
 *
 * It does exactly what ``Tracer.op`` and ``_CpuOpCtx.__exit__`` (laggard.tracer._contexts) do, on
 * the same tracer state, read from and written to the tracer's instance dict: ``_plain``,
 * ``_compute_code``, ``_gcq``, ``_excl_ns``, ``_clock``, ``_n``, ``_room`` and ``_mv``. Anything else
 * (another kind, a stream, sequence lengths, an unknown name, a full page, GC pauses to drain)
 * goes back to the Python code, so there is one implementation of everything but the common case.
 * No Python code runs between reading ``_n`` and writing it back: a flush from another thread
 * never sees half a record. Records are little-endian (laggard.tracer._page.RECORD_FIELDS):
 * on a big-endian machine the module refuses to load and the Python path is used.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>
#ifdef __linux__
#include <time.h>
#endif

#define RECORD_BYTES 36 /* <qqqiii: start_ns, dur_ns, num_tokens, optype, microbatch, aux */
#define FREE_MAX 32     /* finished op objects kept for reuse (creating them is most of the cost) */

static PyObject *s_plain, *s_compute_code, *s_gcq, *s_excl_ns, *s_clock, *s_n, *s_room, *s_mv;
static PyObject *s_drain_gc, *s_rec, *s_compute, *s_name, *s_microbatch, *s_kind, *s_num_tokens;
static PyObject *s_seq_lens, *s_stream;
static PyObject *perf_counter_ns; /* time.perf_counter_ns: read with clock_gettime directly */
static PyObject *laggard_error;   /* laggard.optable.ops.LaggardError, given by setup() */
static PyObject *minus_one;       /* -1: a microbatch or num_tokens not given */

typedef struct OpMethod OpMethod;

typedef struct {
    PyObject_HEAD
    OpMethod *owner; /* owned */
    PyObject *mb;    /* owned: the microbatch as given (-1 when not) */
    PyObject *ntok;  /* owned: num_tokens as given, -1 for None (as the Python path holds them) */
    PyObject *code;  /* owned */
    long long start;
    long long excl0;
} CpuOp;

struct OpMethod {
    PyObject_HEAD
    PyObject *tracer; /* owned */
    PyObject *dict;   /* owned: the tracer's instance dict */
    PyObject *slow;   /* owned: the Python ``Tracer.op`` bound to the tracer */
    CpuOp *free[FREE_MAX];
    int nfree;
};

static PyTypeObject CpuOpType;
static PyTypeObject OpMethodType;

/* ---------------------------------------------------------------- helpers */

/* The tracer's clock as int64 ns; -1 with an exception set on failure (an error, not a time). */
static int read_clock(PyObject *dict, long long *out) {
    PyObject *clock = PyDict_GetItemWithError(dict, s_clock); /* borrowed */
    if (clock == NULL) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_AttributeError, "Tracer has no _clock");
        return -1;
    }
#ifdef __linux__
    if (clock == perf_counter_ns) { /* CPython's perf_counter_ns is CLOCK_MONOTONIC on Linux (only) */
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        *out = (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
        return 0;
    }
#endif
    PyObject *v = PyObject_CallNoArgs(clock);
    if (v == NULL) return -1;
    *out = PyLong_AsLongLong(v);
    Py_DECREF(v);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

static int get_ll(PyObject *dict, PyObject *key, long long *out) {
    PyObject *v = PyDict_GetItemWithError(dict, key);
    if (v == NULL) {
        if (!PyErr_Occurred()) PyErr_SetObject(PyExc_AttributeError, key);
        return -1;
    }
    *out = PyLong_AsLongLong(v);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

static int set_ll(PyObject *dict, PyObject *key, long long value) {
    PyObject *v = PyLong_FromLongLong(value);
    if (v == NULL) return -1;
    int r = PyDict_SetItem(dict, key, v);
    Py_DECREF(v);
    return r;
}

/* ``if t._gcq: t._drain_gc()`` */
static int drain_gc(OpMethod *m) {
    PyObject *q = PyDict_GetItemWithError(m->dict, s_gcq);
    if (q == NULL) return PyErr_Occurred() ? -1 : 0;
    int pending = PyObject_IsTrue(q);
    if (pending <= 0) return pending;
    PyObject *r = PyObject_CallMethodNoArgs(m->tracer, s_drain_gc);
    if (r == NULL) return -1;
    Py_DECREF(r);
    return 0;
}

/* an integer field of the record: what struct's 'q'/'i' accept (anything with __index__, in range) */
static int field(PyObject *v, long long lo, long long hi, long long *out) {
    if (PyFloat_Check(v)) return -1; /* struct refuses floats; PyLong_AsLongLong would not */
    long long x = PyLong_AsLongLong(v);
    if (x == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return -1;
    }
    if (x < lo || x > hi) return -1;
    *out = x;
    return 0;
}

/* ---------------------------------------------------------------- CpuOp */

static void cpuop_clear_fields(CpuOp *self) {
    Py_CLEAR(self->mb);
    Py_CLEAR(self->ntok);
    Py_CLEAR(self->code);
}

static int cpuop_traverse(CpuOp *self, visitproc visit, void *arg) {
    Py_VISIT(self->owner);
    Py_VISIT(self->mb);
    Py_VISIT(self->ntok);
    Py_VISIT(self->code);
    return 0;
}

static int cpuop_clear(CpuOp *self) {
    Py_CLEAR(self->owner);
    cpuop_clear_fields(self);
    return 0;
}

static void cpuop_dealloc(CpuOp *self) {
    PyObject_GC_UnTrack(self);
    cpuop_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *cpuop_enter(PyObject *self, PyObject *unused) {
    Py_RETURN_NONE; /* ``with tracer.op(...) as x`` binds None, as on the Python fast path */
}

/* the record's integer fields; 0 when one is not what struct's 'q'/'i' would take */
typedef struct {
    long long ntok, mb, code;
} Fields;

static int fields_of(CpuOp *op, Fields *f) {
    return field(op->ntok, LLONG_MIN, LLONG_MAX, &f->ntok) == 0 && field(op->mb, INT32_MIN, INT32_MAX, &f->mb) == 0
           && field(op->code, INT32_MIN, INT32_MAX, &f->code) == 0;
}

/* pack the record into row ``i`` of the page (room checked by the caller); -1 on error */
static int pack(OpMethod *m, const Fields *f, long long i, long long start, long long dur) {
    PyObject *mv = PyDict_GetItemWithError(m->dict, s_mv);
    if (mv == NULL) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_AttributeError, "Tracer has no _mv");
        return -1;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(mv, &view, PyBUF_WRITABLE) < 0) return -1;
    if ((i + 1) * RECORD_BYTES > view.len) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_RuntimeError, "Tracer: page smaller than its room");
        return -1;
    }
    char *p = (char *)view.buf + i * RECORD_BYTES;
    int32_t c32 = (int32_t)f->code, mb32 = (int32_t)f->mb, aux = -1;
    int64_t s64 = start, d64 = dur, n64 = f->ntok;
    memcpy(p, &s64, 8);
    memcpy(p + 8, &d64, 8);
    memcpy(p + 16, &n64, 8);
    memcpy(p + 24, &c32, 4);
    memcpy(p + 28, &mb32, 4);
    memcpy(p + 32, &aux, 4);
    PyBuffer_Release(&view);
    return 0;
}

/* a full page (or none): the general path, ``t._rec(code, mb, start, dur, ntok, None)`` */
static int record_slow(OpMethod *m, CpuOp *op, long long start, long long dur) {
    PyObject *s = PyLong_FromLongLong(start), *d = PyLong_FromLongLong(dur);
    PyObject *r = NULL;
    if (s && d) r = PyObject_CallMethodObjArgs(m->tracer, s_rec, op->code, op->mb, s, d, op->ntok, Py_None, NULL);
    Py_XDECREF(s);
    Py_XDECREF(d);
    if (r == NULL) return -1;
    Py_DECREF(r);
    return 0;
}

static PyObject *cpuop_exit(CpuOp *self, PyObject *const *args, Py_ssize_t nargs) {
    OpMethod *m = self->owner;
    if (m == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Tracer.op: this op has already ended");
        return NULL;
    }
    PyObject *dict = m->dict;
    long long end, excl, i, room;
    if (read_clock(dict, &end) < 0 || drain_gc(m) < 0 || get_ll(dict, s_excl_ns, &excl) < 0) return NULL;
    /* time spent in ops recorded inside this one (nested ops, GC pauses) is theirs */
    long long dur = end - self->start - (excl - self->excl0);
    if (set_ll(dict, s_excl_ns, excl + dur) < 0) return NULL;
    /* converted before ``_n`` is read: a user's __index__ may run Python code (and let a flush in) */
    Fields f;
    int good = fields_of(self, &f);
    if (get_ll(dict, s_n, &i) < 0 || get_ll(dict, s_room, &room) < 0) return NULL;
    if (i < room) { /* the common case */
        if (!good) {
            PyErr_Format(laggard_error, "Tracer.op: microbatch and num_tokens must be integers, got %R and %R",
                         self->mb, self->ntok);
            return NULL;
        }
        if (pack(m, &f, i, self->start, dur) < 0 || set_ll(dict, s_n, i + 1) < 0) return NULL;
    } else if (record_slow(m, self, self->start, dur) < 0) {
        return NULL;
    }
    cpuop_clear_fields(self);
    if (m->nfree < FREE_MAX) { /* reused by the next op() */
        Py_INCREF(self);
        m->free[m->nfree++] = self;
        Py_CLEAR(self->owner); /* the free list is the method's: no cycle through it */
    }
    Py_RETURN_FALSE;
}

static PyMethodDef cpuop_methods[] = {
    {"__enter__", (PyCFunction)cpuop_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)(void (*)(void))cpuop_exit, METH_FASTCALL, NULL},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject CpuOpType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "laggard.tracer._fastop.CpuOp",
    .tp_basicsize = sizeof(CpuOp),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "A compute op being timed on the CPU (Tracer.op's compiled fast path).",
    .tp_traverse = (traverseproc)cpuop_traverse,
    .tp_clear = (inquiry)cpuop_clear,
    .tp_dealloc = (destructor)cpuop_dealloc,
    .tp_methods = cpuop_methods,
};

/* ---------------------------------------------------------------- OpMethod */

/* the arguments of ``op(name, microbatch=-1, kind="compute", num_tokens=None, seq_lens=None,
 * stream=None)``; 0 when they are not the fast path's (the Python method then takes them all) */
static int fast_args(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, PyObject **name,
                     PyObject **mb, PyObject **ntok) {
    static PyObject **const keys[] = {&s_name, &s_microbatch, &s_kind, &s_num_tokens, &s_seq_lens, &s_stream};
    PyObject *v[6] = {NULL, NULL, NULL, NULL, NULL, NULL};
    if (nargs > 6) return 0;
    for (Py_ssize_t k = 0; k < nargs; k++) v[k] = args[k];
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t k = 0; k < nkw; k++) {
        PyObject *key = PyTuple_GET_ITEM(kwnames, k);
        int slot = -1;
        for (int j = 0; j < 6 && slot < 0; j++)
            if (key == *keys[j] || PyUnicode_Compare(key, *keys[j]) == 0) slot = j;
        if (slot < 0 || v[slot] != NULL) return 0; /* unknown or repeated: Python's TypeError */
        v[slot] = args[nargs + k];
    }
    if (v[0] == NULL) return 0;
    if (v[2] != NULL && v[2] != s_compute && !(PyUnicode_Check(v[2]) && PyUnicode_Compare(v[2], s_compute) == 0))
        return 0;
    if ((v[4] != NULL && v[4] != Py_None) || (v[5] != NULL && v[5] != Py_None)) return 0;
    *name = v[0];
    *mb = v[1] ? v[1] : minus_one;
    *ntok = (v[3] == NULL || v[3] == Py_None) ? minus_one : v[3];
    return 1;
}

/* the compute code of ``name`` when the fast path applies (borrowed), else NULL (no error) */
static PyObject *fast_code(OpMethod *m, PyObject *name) {
    PyObject *plain = PyDict_GetItemWithError(m->dict, s_plain);
    if (plain != Py_True) return NULL;
    PyObject *codes = PyDict_GetItemWithError(m->dict, s_compute_code);
    if (codes == NULL || !PyDict_CheckExact(codes) || !PyUnicode_Check(name)) return NULL;
    return PyDict_GetItemWithError(codes, name);
}

static PyObject *opmethod_call(OpMethod *m, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyObject *name, *mb, *ntok, *code;
    if (!fast_args(args, nargs, kwnames, &name, &mb, &ntok) || (code = fast_code(m, name)) == NULL) {
        if (PyErr_Occurred()) return NULL;
        return PyObject_Vectorcall(m->slow, args, nargsf, kwnames);
    }
    CpuOp *op;
    if (m->nfree > 0) {
        op = m->free[--m->nfree]; /* the reference the free list held */
    } else if ((op = PyObject_GC_New(CpuOp, &CpuOpType)) != NULL) {
        op->owner = NULL;
        op->mb = op->ntok = op->code = NULL;
        PyObject_GC_Track(op);
    } else {
        return NULL;
    }
    Py_INCREF(m);
    Py_XSETREF(op->owner, m);
    Py_INCREF(code);
    Py_XSETREF(op->code, code);
    Py_INCREF(mb);
    Py_XSETREF(op->mb, mb);
    Py_INCREF(ntok);
    Py_XSETREF(op->ntok, ntok);
    long long excl;
    if (drain_gc(m) < 0 || get_ll(m->dict, s_excl_ns, &excl) < 0) goto fail;
    op->excl0 = excl;
    if (read_clock(m->dict, &op->start) < 0) goto fail; /* last: the op starts here */
    return (PyObject *)op;
fail:
    Py_DECREF(op);
    return NULL;
}

static PyObject *opmethod_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    return opmethod_call((OpMethod *)self, args, nargsf, kwnames);
}

static PyObject *opmethod_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *tracer, *slow;
    if (!PyArg_ParseTuple(args, "OO:OpMethod", &tracer, &slow)) return NULL;
    PyObject *dict = PyObject_GenericGetDict(tracer, NULL);
    if (dict == NULL) return NULL;
    OpMethod *m = (OpMethod *)type->tp_alloc(type, 0);
    if (m == NULL) {
        Py_DECREF(dict);
        return NULL;
    }
    Py_INCREF(tracer);
    Py_INCREF(slow);
    m->tracer = tracer;
    m->dict = dict;
    m->slow = slow;
    m->nfree = 0;
    *(vectorcallfunc *)((char *)m + type->tp_vectorcall_offset) = opmethod_vectorcall;
    return (PyObject *)m;
}

static int opmethod_traverse(OpMethod *m, visitproc visit, void *arg) {
    Py_VISIT(m->tracer);
    Py_VISIT(m->dict);
    Py_VISIT(m->slow);
    for (int k = 0; k < m->nfree; k++) Py_VISIT(m->free[k]);
    return 0;
}

static int opmethod_clear(OpMethod *m) {
    Py_CLEAR(m->tracer);
    Py_CLEAR(m->dict);
    Py_CLEAR(m->slow);
    while (m->nfree > 0) Py_CLEAR(m->free[--m->nfree]);
    return 0;
}

static void opmethod_dealloc(OpMethod *m) {
    PyObject_GC_UnTrack(m);
    opmethod_clear(m);
    Py_TYPE(m)->tp_free((PyObject *)m);
}

static PyObject *opmethod_slow(OpMethod *m, void *unused) {
    Py_INCREF(m->slow);
    return m->slow;
}

static PyObject *opmethod_doc(OpMethod *m, void *unused) {
    return PyObject_GetAttrString(m->slow, "__doc__"); /* help(tracer.op) reads Tracer.op's */
}

static PyGetSetDef opmethod_getset[] = {
    {"__wrapped__", (getter)opmethod_slow, NULL, "The Python Tracer.op this fast path stands in for.", NULL},
    {"__doc__", (getter)opmethod_doc, NULL, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject OpMethodType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "laggard.tracer._fastop.OpMethod",
    .tp_basicsize = sizeof(OpMethod) + sizeof(vectorcallfunc),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "OpMethod(tracer, slow): Tracer.op with the common case compiled (see the module).",
    .tp_traverse = (traverseproc)opmethod_traverse,
    .tp_clear = (inquiry)opmethod_clear,
    .tp_dealloc = (destructor)opmethod_dealloc,
    .tp_new = opmethod_new,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = sizeof(OpMethod),
    .tp_getset = opmethod_getset,
};

/* ---------------------------------------------------------------- module */

static PyObject *setup(PyObject *module, PyObject *args) {
    PyObject *err, *clock, *record_bytes;
    if (!PyArg_ParseTuple(args, "OOO:setup", &err, &clock, &record_bytes)) return NULL;
    if (PyLong_AsLong(record_bytes) != RECORD_BYTES) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ImportError, "record layout differs from laggard.tracer._page");
        return NULL;
    }
    Py_INCREF(err);
    Py_XSETREF(laggard_error, err);
    Py_INCREF(clock);
    Py_XSETREF(perf_counter_ns, clock);
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"setup", setup, METH_VARARGS, "setup(LaggardError, time.perf_counter_ns, RECORD_BYTES)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_fastop", "Tracer.op's compiled fast path (see the source's header).", -1,
    module_methods,
};

#define INTERN(var, text) \
    if ((var = PyUnicode_InternFromString(text)) == NULL) return NULL

PyMODINIT_FUNC PyInit__fastop(void) {
#if PY_BIG_ENDIAN
    PyErr_SetString(PyExc_ImportError, "laggard.tracer._fastop writes little-endian records only");
    return NULL;
#endif
    if ((minus_one = PyLong_FromLong(-1)) == NULL) return NULL;
    INTERN(s_plain, "_plain");
    INTERN(s_compute_code, "_compute_code");
    INTERN(s_gcq, "_gcq");
    INTERN(s_excl_ns, "_excl_ns");
    INTERN(s_clock, "_clock");
    INTERN(s_n, "_n");
    INTERN(s_room, "_room");
    INTERN(s_mv, "_mv");
    INTERN(s_drain_gc, "_drain_gc");
    INTERN(s_rec, "_rec");
    INTERN(s_compute, "compute");
    INTERN(s_name, "name");
    INTERN(s_microbatch, "microbatch");
    INTERN(s_kind, "kind");
    INTERN(s_num_tokens, "num_tokens");
    INTERN(s_seq_lens, "seq_lens");
    INTERN(s_stream, "stream");
    if (PyType_Ready(&CpuOpType) < 0 || PyType_Ready(&OpMethodType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL) return NULL;
    Py_INCREF(&OpMethodType);
    if (PyModule_AddObject(m, "OpMethod", (PyObject *)&OpMethodType) < 0) {
        Py_DECREF(&OpMethodType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
