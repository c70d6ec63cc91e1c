/* The engine's compiled kernels (laggard.engine.kernels): the replay loop, ``laggard.engine.replay.propagate``
 * over a graph's segments; the levels of a graph's nodes (``levels``) and the gap step's running maxima
 * (``running_max``), at the end of this file.
 *
 * The Python twin (replay.py, ``_propagate_numpy``) makes a few numpy calls per (level, in-degree)
 * segment: thousands of calls of a few rows each on a pipeline's graph. Here one call walks every
 * segment. Each node's value (a row of S scenario columns) gets the maximum of its predecessors'
 * rows added to it, predecessor by predecessor in the order the graph lists them, exactly as the
 * numpy code does (np.maximum's NaN rule included: a NaN predecessor makes the maximum NaN), so the
 * results are the same to the bit. ``floor``: after each segment its held-back nodes end no earlier
 * than their held times (1-D values only, as in the Python code).
 *
 * Arguments are buffers (numpy arrays), checked here: C-contiguous, their formats and sizes, each
 * segment's positions and each predecessor index before it is read (an IndexError names the segment
 * of the first one out of range; the rows before it are replayed). The GIL is released while the loop
 * runs.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    Py_buffer b;
    int held;
} Buf;

static void release(Buf *bufs, int n) {
    for (int i = 0; i < n; i++)
        if (bufs[i].held) PyBuffer_Release(&bufs[i].b);
}

/* A buffer of ``itemsize``-byte items (``what``: the kernel and argument a TypeError names) of kind ``kind`` ('f': float, 'i': signed integer; itemsize 0: an
 * index array of int32 or int64, as predecessors may be). */
static int get(PyObject *obj, Buf *out, int writable, char kind, Py_ssize_t itemsize, const char *what) {
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, &out->b, flags) < 0) return -1;
    out->held = 1;
    const char *f = out->b.format ? out->b.format : "B";
    if (*f == '<' || *f == '=' || *f == '@') f++;
    Py_ssize_t got = out->b.itemsize;
    int size_ok = itemsize ? got == itemsize : (got == 4 || got == 8);
    if (size_ok && f[1] == '\0' && (kind == 'f' ? *f == 'd' : (*f == 'i' || *f == 'l' || *f == 'q'))) return 0;
    if (itemsize == 0)
        PyErr_Format(PyExc_TypeError, "%s must be int32 or int64, got format %s", what, f);
    else
        PyErr_Format(PyExc_TypeError, "%s must be %s of %zd bytes, got format %s itemsize %zd", what,
                     kind == 'f' ? "floats" : "signed integers", itemsize, f, got);
    return -1;
}

/* One argument of a kernel that takes only buffers: how ``get`` checks it. */
typedef struct {
    int writable;
    char kind;
    Py_ssize_t itemsize;
    const char *what;
} Arg;

/* A kernel's ``n`` positional arguments, each a buffer checked by ``get`` against its ``spec``; ``bufs``
 * zeroed by the caller and released by it on failure too. */
static int get_args(PyObject *args, const char *name, const Arg *spec, Buf *bufs, Py_ssize_t n) {
    if (PyTuple_GET_SIZE(args) != n) {
        PyErr_Format(PyExc_TypeError, "%s() takes exactly %zd arguments (%zd given)", name, n, PyTuple_GET_SIZE(args));
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        if (get(PyTuple_GET_ITEM(args, i), &bufs[i], spec[i].writable, spec[i].kind, spec[i].itemsize, spec[i].what) < 0)
            return -1;
    return 0;
}

/* Whether segment s's position range and predecessor slice are in bounds. */
static int segment_ok(int64_t nrows, int64_t a, int64_t b, int64_t k, int64_t o, Py_ssize_t npred) {
    return a >= 0 && b >= a && b <= nrows && k >= 1 && o >= 0 && (b - a) <= (INT64_MAX - o) / k &&
           o + (b - a) * k <= npred;
}

/* max(m, x) as np.maximum takes it: NaN if either is NaN (m's where both are). A select, not a branch: over
 * a row of scenario columns the compiler vectorizes it (setup.py builds this file with -O3; trace-AR's 23
 * columns replay in 4.8 ms instead of 9) */
#define NP_MAX(m, x) ((m) = ((x) > (m) || ((x) != (x) && (m) == (m))) ? (x) : (m))

/* A predecessor index is checked as it is read (a separate pass over all of them first cost 16 of 38
 * ms a column at 4,096 workers): the first one out of range stops the loop, returning its segment
 * (1-based); the rows before it are replayed. */
#define IN_RANGE(q) ((q) >= 0 && (int64_t)(q) < nrows)

#define RUN(T)                                                                                                   \
    static Py_ssize_t run_##T(double *vals, int64_t nrows, int64_t S, const int64_t *st, const int64_t *en,      \
                              const int64_t *kk, const int64_t *off, Py_ssize_t nseg, const T *pred,             \
                              Py_ssize_t npred, const int64_t *fpos, const double *held, const int64_t *lo,      \
                              const int64_t *hi, double *m) {                                                    \
        for (Py_ssize_t s = 0; s < nseg; s++) {                                                                  \
            int64_t a = st[s], b = en[s], k = kk[s];                                                             \
            if (!segment_ok(nrows, a, b, k, off[s], npred)) return s + 1;                                        \
            const T *p = pred + off[s];                                                                          \
            if (S == 1 && k == 1) {                                                                              \
                for (int64_t r = a; r < b; r++) {                                                                \
                    T q = p[r - a];                                                                              \
                    if (!IN_RANGE(q)) return s + 1;                                                              \
                    vals[r] += vals[q];                                                                          \
                }                                                                                                \
            } else if (S == 1) {                                                                                 \
                for (int64_t r = a; r < b; r++, p += k) {                                                        \
                    if (!IN_RANGE(p[0])) return s + 1;                                                           \
                    double mx = vals[p[0]];                                                                      \
                    for (int64_t t = 1; t < k; t++) {                                                            \
                        if (!IN_RANGE(p[t])) return s + 1;                                                       \
                        NP_MAX(mx, vals[p[t]]);                                                                  \
                    }                                                                                            \
                    vals[r] += mx;                                                                               \
                }                                                                                                \
            } else {                                                                                             \
                for (int64_t r = a; r < b; r++, p += k) {                                                        \
                    double *dst = vals + r * S;                                                                  \
                    if (!IN_RANGE(p[0])) return s + 1;                                                           \
                    memcpy(m, vals + (int64_t)p[0] * S, (size_t)S * sizeof(double));                             \
                    for (int64_t t = 1; t < k; t++) {                                                            \
                        if (!IN_RANGE(p[t])) return s + 1;                                                       \
                        const double *x = vals + (int64_t)p[t] * S;                                              \
                        for (int64_t c = 0; c < S; c++) NP_MAX(m[c], x[c]);                                      \
                    }                                                                                            \
                    for (int64_t c = 0; c < S; c++) dst[c] += m[c];                                              \
                }                                                                                                \
            }                                                                                                    \
            if (fpos != NULL) /* held-back nodes of this segment: no earlier than their floor */                 \
                for (int64_t i = lo[s]; i < hi[s]; i++) NP_MAX(vals[fpos[i]], held[i]);                          \
        }                                                                                                        \
        return 0;                                                                                                \
    }
RUN(int32_t)
RUN(int64_t)

/* propagate(vals, seg_start, seg_end, seg_k, seg_off, seg_pred[, fpos, held, lo, hi]) */
static PyObject *propagate(PyObject *self, PyObject *args) {
    PyObject *o[10] = {NULL};
    if (!PyArg_ParseTuple(args, "OOOOOO|OOOO:propagate", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6], &o[7],
                          &o[8], &o[9]))
        return NULL;
    int floor = o[6] != NULL;
    if (floor && (o[7] == NULL || o[8] == NULL || o[9] == NULL)) {
        PyErr_SetString(PyExc_TypeError, "propagate: a floor needs fpos, held, lo and hi");
        return NULL;
    }
    Buf bufs[10];
    memset(bufs, 0, sizeof bufs);
    static const char *names[] = {"propagate: vals", "propagate: seg_start", "propagate: seg_end",
                                  "propagate: seg_k", "propagate: seg_off", "propagate: seg_pred",
                                  "propagate: fpos", "propagate: held", "propagate: lo", "propagate: hi"};
    if (get(o[0], &bufs[0], 1, 'f', 8, names[0]) < 0) goto fail;
    for (int i = 1; i <= 4; i++)
        if (get(o[i], &bufs[i], 0, 'i', 8, names[i]) < 0) goto fail;
    if (get(o[5], &bufs[5], 0, 'i', 0, names[5]) < 0) goto fail;
    if (floor) {
        if (get(o[6], &bufs[6], 0, 'i', 8, names[6]) < 0 || get(o[7], &bufs[7], 0, 'f', 8, names[7]) < 0 ||
            get(o[8], &bufs[8], 0, 'i', 8, names[8]) < 0 || get(o[9], &bufs[9], 0, 'i', 8, names[9]) < 0)
            goto fail;
    }
    Py_buffer *v = &bufs[0].b;
    if (v->ndim < 1 || v->ndim > 2) {
        PyErr_SetString(PyExc_ValueError, "propagate: vals must be 1-D or 2-D");
        goto fail;
    }
    int64_t nrows = v->shape[0], S = v->ndim == 2 ? v->shape[1] : 1;
    Py_ssize_t nseg = bufs[1].b.len / 8;
    if (bufs[2].b.len / 8 != nseg || bufs[3].b.len / 8 != nseg || bufs[4].b.len / 8 != nseg) {
        PyErr_SetString(PyExc_ValueError, "propagate: the segment arrays differ in length");
        goto fail;
    }
    int narrow = bufs[5].b.itemsize == 4; /* int32 predecessors */
    Py_ssize_t npred = bufs[5].b.len / bufs[5].b.itemsize;
    const int64_t *st = bufs[1].b.buf, *en = bufs[2].b.buf, *kk = bufs[3].b.buf, *off = bufs[4].b.buf;
    const int64_t *fpos = NULL, *lo = NULL, *hi = NULL;
    const double *held = NULL;
    if (floor) {
        fpos = bufs[6].b.buf, held = bufs[7].b.buf, lo = bufs[8].b.buf, hi = bufs[9].b.buf;
        Py_ssize_t nf = bufs[6].b.len / 8;
        if (S != 1 || bufs[7].b.len / 8 != nf || bufs[8].b.len / 8 != nseg || bufs[9].b.len / 8 != nseg) {
            PyErr_SetString(PyExc_ValueError, "propagate: a floor is for 1-D vals, with a held time per position "
                                              "and a (lo, hi) range per segment");
            goto fail;
        }
        for (Py_ssize_t i = 0; i < nf; i++)
            if (fpos[i] < 0 || fpos[i] >= nrows) {
                PyErr_Format(PyExc_IndexError, "propagate: floor position %zd out of range", i);
                goto fail;
            }
        for (Py_ssize_t s = 0; s < nseg; s++)
            if (lo[s] < 0 || hi[s] < lo[s] || hi[s] > nf) {
                PyErr_Format(PyExc_IndexError, "propagate: floor range of segment %zd out of range", s);
                goto fail;
            }
    }
    if (S == 0) { /* no scenario: nothing to replay */
        release(bufs, 10);
        Py_RETURN_NONE;
    }
    double *m = S > 1 ? PyMem_RawMalloc((size_t)S * sizeof(double)) : NULL;
    if (S > 1 && m == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    Py_ssize_t bad;
    Py_BEGIN_ALLOW_THREADS
    bad = narrow ? run_int32_t((double *)v->buf, nrows, S, st, en, kk, off, nseg, bufs[5].b.buf, npred, fpos, held,
                               lo, hi, m)
                 : run_int64_t((double *)v->buf, nrows, S, st, en, kk, off, nseg, bufs[5].b.buf, npred, fpos, held,
                               lo, hi, m);
    Py_END_ALLOW_THREADS
    if (bad) {
        PyMem_RawFree(m);
        PyErr_Format(PyExc_IndexError,
                     "propagate: segment %zd has positions or predecessors out of range (the rows before it are "
                     "replayed)", bad - 1);
        goto fail;
    }
    PyMem_RawFree(m);
    release(bufs, 10);
    Py_RETURN_NONE;
fail:
    release(bufs, 10);
    return NULL;
}

/* levels(sptr, sidx, indeg, level): each node's level by Kahn's algorithm, as laggard.engine.plan.levels's
 * numpy twin gives it: the nodes without predecessors (indeg 0) are level 0, every other node one more than
 * its latest predecessor (the longest path to it). ``sptr``/``sidx``: the successors of each node (CSR,
 * repeated edges repeated); ``indeg``: each node's predecessor count, decremented in place as they are
 * levelled; ``level`` (int64, written): -1 for nodes on or behind a cycle. Returns the number levelled. */
static PyObject *levels(PyObject *self, PyObject *args) {
    static const Arg spec[] = {{0, 'i', 8, "levels: sptr"}, {0, 'i', 0, "levels: sidx"},
                               {1, 'i', 8, "levels: indeg"}, {1, 'i', 8, "levels: level"}};
    Buf bufs[4];
    memset(bufs, 0, sizeof bufs);
    if (get_args(args, "levels", spec, bufs, 4) < 0) goto fail;
    Py_ssize_t n = bufs[3].b.len / 8, ne = bufs[1].b.len / bufs[1].b.itemsize;
    const int64_t *sptr = bufs[0].b.buf;
    int64_t *indeg = bufs[2].b.buf, *level = bufs[3].b.buf;
    if (bufs[0].b.len / 8 != n + 1 || bufs[2].b.len / 8 != n) {
        PyErr_SetString(PyExc_ValueError, "levels: sptr needs a row per node and one more, indeg a count per node");
        goto fail;
    }
    for (Py_ssize_t v = 0; v < n; v++)
        if (sptr[v] < 0 || sptr[v + 1] < sptr[v] || sptr[v + 1] > ne) {
            PyErr_Format(PyExc_IndexError, "levels: the successors of node %zd are out of range", v);
            goto fail;
        }
    int64_t *queue = PyMem_RawMalloc((size_t)(n ? n : 1) * sizeof(int64_t));
    if (queue == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    Py_ssize_t head = 0, tail = 0, bad = -1;
    int narrow = bufs[1].b.itemsize == 4;
    const int32_t *s32 = bufs[1].b.buf;
    const int64_t *s64 = bufs[1].b.buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t v = 0; v < n; v++) {
        level[v] = indeg[v] == 0 ? 0 : -1;
        if (indeg[v] == 0) queue[tail++] = v;
    }
    /* nodes leave the queue in level order's partial order: a node is queued once its last predecessor
     * is levelled, and by then its level is the maximum over them plus one */
    while (head < tail && bad < 0) {
        int64_t u = queue[head++], next = level[u] + 1;
        for (int64_t e = sptr[u]; e < sptr[u + 1]; e++) {
            int64_t v = narrow ? s32[e] : s64[e];
            if (v < 0 || v >= n || indeg[v] <= 0) { /* a successor out of range, or more edges than counted */
                bad = e;
                break;
            }
            if (level[v] < next) level[v] = next;
            if (--indeg[v] == 0) queue[tail++] = v;
        }
    }
    for (Py_ssize_t v = 0; v < n && bad < 0; v++)
        if (indeg[v] != 0) level[v] = -1; /* on or behind a cycle: never freed */
    Py_END_ALLOW_THREADS
    PyMem_RawFree(queue);
    if (bad >= 0) {
        PyErr_Format(PyExc_IndexError, "levels: successor edge %zd names a node out of range or one with fewer "
                                       "predecessors counted", bad);
        goto fail;
    }
    release(bufs, 4);
    return PyLong_FromSsize_t(tail);
fail:
    release(bufs, 4);
    return NULL;
}

/* running_max(values, run_start, running, pos): over runs of ``values`` (int64; run r is positions
 * run_start[r] to the next start), each position's running maximum within its run and the latest position
 * holding it (ties move it on), as laggard.engine.gaps._running_max_numpy gives them. ``run_start``: 0 first,
 * strictly increasing, below n (checked); ``running`` and ``pos`` (int64, n each) are written. */
static PyObject *running_max(PyObject *self, PyObject *args) {
    static const Arg spec[] = {{0, 'i', 8, "running_max: values"}, {0, 'i', 8, "running_max: run_start"},
                               {1, 'i', 8, "running_max: running"}, {1, 'i', 8, "running_max: pos"}};
    Buf bufs[4];
    memset(bufs, 0, sizeof bufs);
    if (get_args(args, "running_max", spec, bufs, 4) < 0) goto fail;
    Py_ssize_t n = bufs[0].b.len / 8, nr = bufs[1].b.len / 8;
    const int64_t *v = bufs[0].b.buf, *rs = bufs[1].b.buf;
    int64_t *running = bufs[2].b.buf, *pos = bufs[3].b.buf;
    if (bufs[2].b.len / 8 != n || bufs[3].b.len / 8 != n) {
        PyErr_SetString(PyExc_ValueError, "running_max: running and pos need a slot per value");
        goto fail;
    }
    if ((n > 0) != (nr > 0) || (nr > 0 && rs[0] != 0)) {
        PyErr_SetString(PyExc_ValueError, "running_max: the first run must start at 0");
        goto fail;
    }
    for (Py_ssize_t r = 1; r < nr; r++)
        if (rs[r] <= rs[r - 1] || rs[r] >= n) {
            PyErr_Format(PyExc_ValueError, "running_max: run %zd does not start after the one before, within "
                                           "the values", r);
            goto fail;
        }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t r = 0; r < nr; r++) {
        int64_t b = r + 1 < nr ? rs[r + 1] : n, m = v[rs[r]], p = rs[r];
        for (int64_t i = rs[r]; i < b; i++) {
            if (v[i] >= m) {
                m = v[i];
                p = i;
            }
            running[i] = m;
            pos[i] = p;
        }
    }
    Py_END_ALLOW_THREADS
    release(bufs, 4);
    Py_RETURN_NONE;
fail:
    release(bufs, 4);
    return NULL;
}

static PyMethodDef methods[] = {
    {"propagate", propagate, METH_VARARGS,
     "propagate(vals, seg_start, seg_end, seg_k, seg_off, seg_pred[, fpos, held, lo, hi]): the replay over the "
     "graph's segments, in place (laggard.engine.replay.propagate)."},
    {"levels", levels, METH_VARARGS,
     "levels(sptr, sidx, indeg, level): each node's level by Kahn's algorithm, in place (laggard.engine.graph)."},
    {"running_max", running_max, METH_VARARGS,
     "running_max(values, run_start, running, pos): running maxima within runs and where they are, in place "
     "(laggard.engine.gaps)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_replay", "The engine's compiled kernels (see the source's header).", -1, methods,
};

PyMODINIT_FUNC PyInit__replay(void) { return PyModule_Create(&module_def); }
