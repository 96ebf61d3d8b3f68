/* Spans from a Horovod Timeline's B/E events, matched in one pass with a stack per tensor, and
 * the rank-ready X marks inside them: the fast path of hvd_magic.timeline.spans.
 *
 * Matcher().feed(ph, name, ts, pid)   the events in file order, any number of times
 *   ph: uint8 phase characters; name: int32 name ids (the caller's global vocabulary);
 *   ts, pid: int64 (INT64_MIN: absent). Runs without the GIL.
 * Matcher().snapshot() -> the same as finish(), and the matcher goes on (a file still growing)
 * Matcher().finish() -> (start, end, pid, name, depth, ready_span, ready_name, ready_wait)
 *   one entry per B in file order: start, end (INT64_MIN: never closed), pid (int64), name
 *   (int32), depth (uint8, the nesting level inside its tensor, capped at 255);
 *   one entry per span that had X marks while it was its tensor's innermost open span:
 *   ready_span (int64 index of the span), ready_name (int32, the last mark's name: the rank
 *   ready last), ready_wait (int64: the time since the mark before it, 0 with a single mark).
 * Within a tensor spans nest, so an E closes the innermost open B; an E with nothing open is
 * dropped, and a B still open at the end keeps end INT64_MIN (a cut-off file). Events without
 * a time are skipped. One thread at a time: the object is not locked.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define ABSENT INT64_MIN

typedef struct {
    char *data;
    Py_ssize_t size, capacity; /* bytes */
} Column;

static int reserve(Column *c, Py_ssize_t width) {
    if (c->size + width <= c->capacity) return 0;
    Py_ssize_t capacity = c->capacity ? c->capacity * 2 : 1 << 16;
    while (capacity < c->size + width) capacity *= 2;
    char *grown = PyMem_RawRealloc(c->data, capacity);
    if (!grown) return -1;
    c->data = grown;
    c->capacity = capacity;
    return 0;
}

#define PUSH(column, type, value)                                                  \
    do {                                                                           \
        if (reserve(&(column), sizeof(type)) < 0) return -1;                       \
        *(type *)((column).data + (column).size) = (type)(value);                  \
        (column).size += sizeof(type);                                             \
    } while (0)

typedef struct {
    int64_t span, last_ts, previous_ts;
    int32_t last_name, marks;
} Open;

typedef struct {
    Open *items;
    Py_ssize_t size, capacity;
} Stack;

typedef struct {
    PyObject_HEAD
    int64_t *keys; /* pid per slot of the open-addressing table; stacks[slot] is its stack */
    char *used;
    Stack *stacks;
    Py_ssize_t slots, filled;
    Column start, end, pid, name, depth, ready_span, ready_name, ready_wait;
    Py_ssize_t spans;
} Matcher;

static uint64_t mix(int64_t key) {
    uint64_t x = (uint64_t)key * 0x9E3779B97F4A7C15ULL;
    return x ^ (x >> 29);
}

static int grow_table(Matcher *m) {
    Py_ssize_t slots = m->slots ? m->slots * 2 : 1024;
    int64_t *keys = PyMem_RawCalloc(slots, sizeof(int64_t));
    char *used = PyMem_RawCalloc(slots, 1);
    Stack *stacks = PyMem_RawCalloc(slots, sizeof(Stack));
    if (!keys || !used || !stacks) {
        PyMem_RawFree(keys); PyMem_RawFree(used); PyMem_RawFree(stacks);
        return -1;
    }
    for (Py_ssize_t i = 0; i < m->slots; i++) {
        if (!m->used[i]) continue;
        Py_ssize_t j = (Py_ssize_t)(mix(m->keys[i]) & (uint64_t)(slots - 1));
        while (used[j]) j = (j + 1) & (slots - 1);
        used[j] = 1;
        keys[j] = m->keys[i];
        stacks[j] = m->stacks[i];
    }
    PyMem_RawFree(m->keys); PyMem_RawFree(m->used); PyMem_RawFree(m->stacks);
    m->keys = keys; m->used = used; m->stacks = stacks; m->slots = slots;
    return 0;
}

static Stack *stack_of(Matcher *m, int64_t pid) {
    if (2 * (m->filled + 1) > m->slots && grow_table(m) < 0) return NULL;
    Py_ssize_t j = (Py_ssize_t)(mix(pid) & (uint64_t)(m->slots - 1));
    while (m->used[j] && m->keys[j] != pid) j = (j + 1) & (m->slots - 1);
    if (!m->used[j]) {
        m->used[j] = 1;
        m->keys[j] = pid;
        m->filled++;
    }
    return &m->stacks[j];
}

static int begin(Matcher *m, Stack *s, int64_t ts, int64_t pid, int32_t name) {
    if (s->size == s->capacity) {
        Py_ssize_t capacity = s->capacity ? s->capacity * 2 : 8;
        Open *grown = PyMem_RawRealloc(s->items, capacity * sizeof(Open));
        if (!grown) return -1;
        s->items = grown;
        s->capacity = capacity;
    }
    s->items[s->size++] = (Open){m->spans, ABSENT, ABSENT, -1, 0};
    PUSH(m->start, int64_t, ts);
    PUSH(m->end, int64_t, ABSENT);
    PUSH(m->pid, int64_t, pid);
    PUSH(m->name, int32_t, name);
    PUSH(m->depth, uint8_t, s->size - 1 > 255 ? 255 : s->size - 1);
    m->spans++;
    return 0;
}

static int close_span(Matcher *m, Stack *s, int64_t ts) {
    Open open = s->items[--s->size];
    ((int64_t *)m->end.data)[open.span] = ts;
    if (open.marks) {
        PUSH(m->ready_span, int64_t, open.span);
        PUSH(m->ready_name, int32_t, open.last_name);
        PUSH(m->ready_wait, int64_t, open.marks > 1 ? open.last_ts - open.previous_ts : 0);
    }
    return 0;
}

static void mark(Stack *s, int64_t ts, int32_t name) {
    Open *top = &s->items[s->size - 1];
    top->previous_ts = top->last_ts;
    top->last_ts = ts;
    top->last_name = name;
    top->marks++;
}

/* -1: out of memory */
static int feed_events(Matcher *m, const uint8_t *ph, const int32_t *name, const int64_t *ts,
                       const int64_t *pid, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) {
        if ((ph[i] != 'B' && ph[i] != 'E' && ph[i] != 'X') || ts[i] == ABSENT) continue; /* no time: no span */
        Stack *s = stack_of(m, pid[i]);
        if (!s) return -1;
        if (ph[i] == 'B') {
            if (begin(m, s, ts[i], pid[i], name[i]) < 0) return -1;
        } else if (!s->size) {
            continue; /* a stray E, or a mark outside any span */
        } else if (ph[i] == 'E') {
            if (close_span(m, s, ts[i]) < 0) return -1;
        } else {
            mark(s, ts[i], name[i]);
        }
    }
    return 0;
}

static PyObject *feed(Matcher *m, PyObject *args) {
    Py_buffer ph, name, ts, pid;
    if (!PyArg_ParseTuple(args, "y*y*y*y*", &ph, &name, &ts, &pid)) return NULL;
    PyObject *result = NULL;
    Py_ssize_t n = ph.len;
    if (name.len != n * 4 || ts.len != n * 8 || pid.len != n * 8) {
        PyErr_SetString(PyExc_ValueError, "feed: ph, name, ts and pid must hold the same number of events");
        goto done;
    }
    int failed;
    Py_BEGIN_ALLOW_THREADS
    failed = feed_events(m, ph.buf, name.buf, ts.buf, pid.buf, n);
    Py_END_ALLOW_THREADS
    if (failed) PyErr_NoMemory();
    else result = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&ph); PyBuffer_Release(&name); PyBuffer_Release(&ts); PyBuffer_Release(&pid);
    return result;
}

#define COLUMNS(m) {&(m)->start, &(m)->end, &(m)->pid, &(m)->name, &(m)->depth, &(m)->ready_span, \
                     &(m)->ready_name, &(m)->ready_wait}

/* The columns as a tuple of bytes; with take, each column is freed once copied (only one is
 * ever held twice) and the matcher starts over. */
static PyObject *columns_as_bytes(Matcher *m, int take) {
    Column *columns[] = COLUMNS(m);
    PyObject *result = PyTuple_New(8);
    if (!result) return NULL;
    for (int k = 0; k < 8; k++) {
        PyObject *bytes = PyBytes_FromStringAndSize(columns[k]->data ? columns[k]->data : "", columns[k]->size);
        if (!bytes) { Py_DECREF(result); return NULL; }
        PyTuple_SET_ITEM(result, k, bytes);
        if (take) {
            PyMem_RawFree(columns[k]->data);
            memset(columns[k], 0, sizeof(Column));
        }
    }
    if (take) {
        m->spans = 0;
        for (Py_ssize_t i = 0; i < m->slots; i++) m->stacks[i].size = 0; /* spans open now never close */
    }
    return result;
}

static PyObject *finish(Matcher *m, PyObject *Py_UNUSED(ignored)) { return columns_as_bytes(m, 1); }

static PyObject *snapshot(Matcher *m, PyObject *Py_UNUSED(ignored)) { return columns_as_bytes(m, 0); }

static void dealloc(Matcher *m) {
    for (Py_ssize_t i = 0; i < m->slots; i++) PyMem_RawFree(m->stacks[i].items);
    PyMem_RawFree(m->keys); PyMem_RawFree(m->used); PyMem_RawFree(m->stacks);
    Column *columns[] = COLUMNS(m);
    for (int k = 0; k < 8; k++) PyMem_RawFree(columns[k]->data);
    Py_TYPE(m)->tp_free((PyObject *)m);
}

static PyMethodDef matcher_methods[] = {
    {"feed", (PyCFunction)feed, METH_VARARGS, "Match the next events (file order)."},
    {"finish", (PyCFunction)finish, METH_NOARGS, "The spans and their readiness marks, as bytes."},
    {"snapshot", (PyCFunction)snapshot, METH_NOARGS, "The spans so far, as bytes; matching goes on."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject MatcherType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "hvd_magic.timeline._match.Matcher",
    .tp_basicsize = sizeof(Matcher),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Spans from B/E events with a stack per tensor (see the file's comment).",
    .tp_new = PyType_GenericNew,
    .tp_dealloc = (destructor)dealloc,
    .tp_methods = matcher_methods,
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_match", NULL, -1, NULL};

PyMODINIT_FUNC PyInit__match(void) {
    if (PyType_Ready(&MatcherType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    if (PyModule_AddObjectRef(m, "Matcher", (PyObject *)&MatcherType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
