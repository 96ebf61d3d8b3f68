/* Spans from a Horovod Timeline's B/E events, matched in one pass with a stack per tensor, and
 * the rank-ready X marks inside them: the fast path of hvd_magic.timeline.matching.
 *
 * Matcher().feed(ph, name, ts, pid)   the events in file order, any number of times
 *   ph: uint8 phase characters; name: int32 name ids (the caller's global vocabulary);
 *   ts, pid: int64 (INT64_MIN: absent). Runs without the GIL.
 * Matcher().tensors() -> (pids, closed): int64 bytes, one entry per tensor in the order first
 *   seen: its pid and how many of its spans are closed.
 * Matcher().finish(order) -> (start, duration, name, depth, in_order, ready_span, ready_name, ready_wait)
 *   order: int32 bytes, tensor indices (as tensors() lists them), each at most once. The closed
 *   spans of those tensors, one tensor after the other, each tensor's in file order: start
 *   (int64), duration (uint32, or int64 when a span lasts 2^32 µs or more, or ends before it
 *   begins), name (int32), depth (uint8, the nesting level inside its tensor, capped at 255);
 *   in_order: every tensor's spans come by start (Horovod writes them so). One entry per span
 *   that had X marks while it was its tensor's innermost open span, in the order they closed
 *   (those of tensors not in order are left out): ready_span (int64, its index in the columns),
 *   ready_name (int32, the last mark's name: the rank ready last), ready_wait (int64: the time
 *   since the mark before it, 0 with a single mark). The matcher starts over afterwards.
 * Matcher().snapshot(order) -> the same, and the matcher goes on (a file still growing).
 * merge(...) -> items merged per pixel of a window, or per bucket of a level of detail: see
 *   the comment above merge() below.
 * trim() -> whether memory went back: gives the heap's free pages back to the system (glibc's
 *   malloc_trim; elsewhere nothing). glibc keeps what a large job freed in the heap, where
 *   scattered live blocks pin it: a kernel that read a large timeline would hold it for good.
 * Within a tensor spans nest, so an E closes the innermost open B; an E with nothing open is
 * dropped, and a B still open is left out (a cut-off file). Events without a time are skipped.
 *
 * Each tensor keeps its spans in blocks that double in size up to a limit, so the spans come
 * grouped by tensor without a sort, and hold about 21 bytes each. Large blocks are mapped
 * from the system rather than taken from the heap: finish() frees each one as soon as it is
 * copied out, so the memory of a large timeline holds its spans about once, not twice.
 * One thread at a time: the object is not locked.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#if defined(__unix__) || defined(__APPLE__)
#include <sys/mman.h>
#define MAPPED_BLOCKS 1
#endif
#ifdef __GLIBC__
#include <malloc.h>
#endif

#define ABSENT INT64_MIN
#define FIRST_BLOCK 256            /* spans */
#define LAST_BLOCK (1 << 16)       /* spans: blocks stop doubling here */
#define MAPPED_BYTES (128 * 1024)  /* blocks this large are mapped, not taken from the heap */
#define SPAN_BYTES (8 + 8 + 4 + 1) /* start, end, name, depth */

typedef struct Block {
    struct Block *next;
    Py_ssize_t size, capacity;
    size_t bytes;
    int64_t *start, *end; /* end: ABSENT while the span is open */
    int32_t *name;
    uint8_t *depth;
} Block;

static Block *new_block(Py_ssize_t capacity) {
    size_t bytes = sizeof(Block) + (size_t)capacity * SPAN_BYTES;
    void *memory;
#ifdef MAPPED_BLOCKS
    if (bytes >= MAPPED_BYTES) {
        memory = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (memory == MAP_FAILED) return NULL;
    } else
#endif
        memory = PyMem_RawMalloc(bytes);
    if (!memory) return NULL;
    Block *b = memory;
    *b = (Block){NULL, 0, capacity, bytes, NULL, NULL, NULL, NULL};
    b->start = (int64_t *)(b + 1); /* sizeof(Block) is a multiple of 8 */
    b->end = b->start + capacity;
    b->name = (int32_t *)(b->end + capacity);
    b->depth = (uint8_t *)(b->name + capacity);
    return b;
}

static void free_block(Block *b) {
#ifdef MAPPED_BLOCKS
    if (b->bytes >= MAPPED_BYTES) {
        munmap(b, b->bytes);
        return;
    }
#endif
    PyMem_RawFree(b);
}

typedef struct {
    int64_t *end; /* the span's end in its block */
    int64_t start, last_ts, previous_ts;
    Py_ssize_t local; /* the span's index among its tensor's spans */
    int32_t last_name, marks;
} Open;

typedef struct {
    int64_t pid;
    Open *open; /* the stack of open spans, innermost last */
    Py_ssize_t depth, room;
    Block *first, *last;
    Py_ssize_t spans, closed;
} Tensor;

typedef struct {
    char *data;
    Py_ssize_t size, capacity; /* bytes */
} Column;

static int push(Column *c, const void *value, Py_ssize_t width) {
    if (c->size + width > c->capacity) {
        Py_ssize_t capacity = c->capacity ? c->capacity + c->capacity / 2 : 1 << 16;
        while (capacity < c->size + width) capacity *= 2;
        char *grown = PyMem_RawRealloc(c->data, capacity);
        if (!grown) return -1;
        c->data = grown;
        c->capacity = capacity;
    }
    memcpy(c->data + c->size, value, width);
    c->size += width;
    return 0;
}

typedef struct { /* one span that had X marks */
    int64_t local, wait;
    int32_t tensor, name;
} Ready;

typedef struct {
    PyObject_HEAD
    int32_t *slots; /* open addressing: tensor index + 1 by pid hash, 0 empty */
    Py_ssize_t slot_count;
    Tensor *tensors;
    Py_ssize_t count, room;
    Column ready; /* Ready records */
    int wide;     /* a closed span's duration does not fit in uint32 */
} Matcher;


static uint64_t mix(int64_t key) {
    uint64_t x = (uint64_t)key * 0x9E3779B97F4A7C15ULL;
    return x ^ (x >> 29);
}

static int grow_slots(Matcher *m) {
    Py_ssize_t count = m->slot_count ? m->slot_count * 2 : 1024;
    int32_t *slots = PyMem_RawCalloc(count, sizeof(int32_t));
    if (!slots) return -1;
    for (Py_ssize_t t = 0; t < m->count; t++) {
        Py_ssize_t j = (Py_ssize_t)(mix(m->tensors[t].pid) & (uint64_t)(count - 1));
        while (slots[j]) j = (j + 1) & (count - 1);
        slots[j] = (int32_t)(t + 1);
    }
    PyMem_RawFree(m->slots);
    m->slots = slots;
    m->slot_count = count;
    return 0;
}

/* The tensor of pid, added when new; NULL: out of memory. The pointer holds until the next call. */
static Tensor *tensor_of(Matcher *m, int64_t pid) {
    if (2 * (m->count + 1) > m->slot_count && grow_slots(m) < 0) return NULL;
    Py_ssize_t j = (Py_ssize_t)(mix(pid) & (uint64_t)(m->slot_count - 1));
    while (m->slots[j] && m->tensors[m->slots[j] - 1].pid != pid) j = (j + 1) & (m->slot_count - 1);
    if (m->slots[j]) return &m->tensors[m->slots[j] - 1];
    if (m->count == m->room) {
        Py_ssize_t room = m->room ? 2 * m->room : 64;
        Tensor *grown = room < INT32_MAX ? PyMem_RawRealloc(m->tensors, room * sizeof(Tensor)) : NULL;
        if (!grown) return NULL;
        m->tensors = grown;
        m->room = room;
    }
    m->slots[j] = (int32_t)(m->count + 1);
    Tensor *t = &m->tensors[m->count++];
    *t = (Tensor){pid, NULL, 0, 0, NULL, NULL, 0, 0};
    return t;
}

static int begin(Tensor *t, int64_t ts, int32_t name) {
    if (t->depth == t->room) {
        Py_ssize_t room = t->room ? t->room * 2 : 8;
        Open *grown = PyMem_RawRealloc(t->open, room * sizeof(Open));
        if (!grown) return -1;
        t->open = grown;
        t->room = room;
    }
    Block *b = t->last;
    if (!b || b->size == b->capacity) { /* each new block as large as the tensor's spans so far */
        Block *fresh = new_block(t->spans < FIRST_BLOCK ? FIRST_BLOCK : t->spans > LAST_BLOCK ? LAST_BLOCK : t->spans);
        if (!fresh) return -1;
        if (b) b->next = fresh;
        else t->first = fresh;
        t->last = b = fresh;
    }
    Py_ssize_t i = b->size++;
    b->start[i] = ts;
    b->end[i] = ABSENT;
    b->name[i] = name;
    b->depth[i] = t->depth > 255 ? 255 : (uint8_t)t->depth;
    t->open[t->depth++] = (Open){&b->end[i], ts, ABSENT, ABSENT, t->spans++, -1, 0};
    return 0;
}

static int close_span(Matcher *m, Tensor *t, int64_t ts) {
    Open open = t->open[--t->depth];
    *open.end = ts;
    t->closed++;
    if (ts < open.start || (uint64_t)ts - (uint64_t)open.start > UINT32_MAX) m->wide = 1;
    if (!open.marks) return 0;
    Ready ready = {open.local, open.marks > 1 ? open.last_ts - open.previous_ts : 0, (int32_t)(t - m->tensors),
                   open.last_name};
    return push(&m->ready, &ready, sizeof ready);
}

static void mark(Tensor *t, int64_t ts, int32_t name) {
    Open *top = &t->open[t->depth - 1];
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
        Tensor *t = tensor_of(m, pid[i]);
        if (!t) return -1;
        if (ph[i] == 'B') {
            if (begin(t, ts[i], name[i]) < 0) return -1;
        } else if (!t->depth) {
            continue; /* a stray E, or a mark outside any span */
        } else if (ph[i] == 'E') {
            if (close_span(m, t, ts[i]) < 0) return -1;
        } else {
            mark(t, ts[i], name[i]);
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

static PyObject *tensors(Matcher *m, PyObject *Py_UNUSED(ignored)) {
    PyObject *pids = PyBytes_FromStringAndSize(NULL, m->count * 8);
    PyObject *closed = PyBytes_FromStringAndSize(NULL, m->count * 8);
    if (!pids || !closed) {
        Py_XDECREF(pids); Py_XDECREF(closed);
        return NULL;
    }
    for (Py_ssize_t t = 0; t < m->count; t++) {
        ((int64_t *)PyBytes_AS_STRING(pids))[t] = m->tensors[t].pid;
        ((int64_t *)PyBytes_AS_STRING(closed))[t] = m->tensors[t].closed;
    }
    return Py_BuildValue("(NN)", pids, closed);
}

/* Everything the matcher holds freed: it starts over. */
static void clear(Matcher *m) {
    for (Py_ssize_t t = 0; t < m->count; t++) {
        for (Block *b = m->tensors[t].first, *next; b; b = next) {
            next = b->next;
            free_block(b);
        }
        PyMem_RawFree(m->tensors[t].open);
    }
    PyMem_RawFree(m->tensors); PyMem_RawFree(m->slots); PyMem_RawFree(m->ready.data);
    m->tensors = NULL; m->slots = NULL; m->ready = (Column){NULL, 0, 0};
    m->count = m->room = m->slot_count = 0;
    m->wide = 0;
}

typedef struct { /* where finish() and snapshot() write the spans */
    int64_t *start;
    char *duration; /* uint32, or int64 when wide */
    int32_t *name;
    uint8_t *depth;
    int wide;
} Out;

/* Copies tensor t's closed spans to out from index at (with take, freeing each block once
 * copied); returns whether they came by start. */
static int copy_spans(Tensor *t, Out *out, Py_ssize_t at, int take) {
    int in_order = 1;
    int64_t previous = INT64_MIN;
    for (Block *b = t->first, *next; b; b = next) {
        next = b->next;
        for (Py_ssize_t i = 0; i < b->size; i++) {
            if (b->end[i] == ABSENT) continue;
            int64_t start = b->start[i];
            out->start[at] = start;
            if (out->wide) ((int64_t *)out->duration)[at] = b->end[i] - start;
            else ((uint32_t *)out->duration)[at] = (uint32_t)(b->end[i] - start);
            out->name[at] = b->name[i];
            out->depth[at] = b->depth[i];
            in_order &= start >= previous;
            previous = start;
            at++;
        }
        if (take) free_block(b);
    }
    if (take) t->first = t->last = NULL;
    return in_order;
}

/* Where tensor t's span number local lands, its tensor's spans starting at offset: after the
 * closed spans before it (the open ones are on its stack, in the order they began). */
static int64_t placed(const Tensor *t, Py_ssize_t offset, int64_t local) {
    int64_t open_before = 0;
    while (open_before < t->depth && t->open[open_before].local < local) open_before++;
    return offset + local - open_before;
}

static void place_ready(Matcher *m, const Py_ssize_t *offset, PyObject **columns) {
    const Ready *ready = (const Ready *)m->ready.data;
    int64_t *span = (int64_t *)PyBytes_AS_STRING(columns[4]);
    int32_t *name = (int32_t *)PyBytes_AS_STRING(columns[5]);
    int64_t *wait = (int64_t *)PyBytes_AS_STRING(columns[6]);
    for (Py_ssize_t i = 0, j = 0; i < m->ready.size / (Py_ssize_t)sizeof(Ready); i++) {
        if (offset[ready[i].tensor] < 0) continue;
        span[j] = placed(&m->tensors[ready[i].tensor], offset[ready[i].tensor], ready[i].local);
        name[j] = ready[i].name;
        wait[j++] = ready[i].wait;
    }
}

/* Each chosen tensor's first index in the output (-1: not chosen); returns the spans, -1 on a bad order. */
static Py_ssize_t offsets_of(Matcher *m, const int32_t *chosen, Py_ssize_t rows, Py_ssize_t *offset) {
    Py_ssize_t n = 0;
    for (Py_ssize_t t = 0; t < m->count; t++) offset[t] = -1;
    for (Py_ssize_t r = 0; r < rows; r++) {
        if (chosen[r] < 0 || chosen[r] >= m->count || offset[chosen[r]] >= 0) return -1;
        offset[chosen[r]] = n;
        n += m->tensors[chosen[r]].closed;
    }
    return n;
}

static PyObject *spans_out(Matcher *m, PyObject *args, int take) {
    Py_buffer order;
    if (!PyArg_ParseTuple(args, "y*", &order)) return NULL;
    PyObject *result = NULL, *columns[7] = {NULL};
    const int32_t *chosen = order.buf;
    Py_ssize_t rows = order.len / 4, kept = 0, n;
    Py_ssize_t *offset = PyMem_RawMalloc((m->count + 1) * sizeof(Py_ssize_t));
    if (!offset) {
        PyErr_NoMemory();
        goto done;
    }
    if (order.len % 4 || (n = offsets_of(m, chosen, rows, offset)) < 0) {
        PyErr_SetString(PyExc_ValueError, "order: int32 tensor indices, each at most once");
        goto done;
    }
    for (Py_ssize_t i = 0; i < m->ready.size / (Py_ssize_t)sizeof(Ready); i++)
        kept += offset[((const Ready *)m->ready.data)[i].tensor] >= 0;
    Py_ssize_t widths[7] = {8, m->wide ? 8 : 4, 4, 1, 8, 4, 8}, lengths[7] = {n, n, n, n, kept, kept, kept};
    for (int c = 0; c < 7; c++)
        if (!(columns[c] = PyBytes_FromStringAndSize(NULL, widths[c] * lengths[c]))) goto done;
    place_ready(m, offset, columns);
    Out out = {(int64_t *)PyBytes_AS_STRING(columns[0]), PyBytes_AS_STRING(columns[1]),
               (int32_t *)PyBytes_AS_STRING(columns[2]), (uint8_t *)PyBytes_AS_STRING(columns[3]), m->wide};
    int in_order = 1;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t r = 0; r < rows; r++) in_order &= copy_spans(&m->tensors[chosen[r]], &out, offset[chosen[r]], take);
    if (take) clear(m);
    Py_END_ALLOW_THREADS
    result = Py_BuildValue("(OOOONOOO)", columns[0], columns[1], columns[2], columns[3], PyBool_FromLong(in_order),
                           columns[4], columns[5], columns[6]);
done:
    for (int c = 0; c < 7; c++) Py_XDECREF(columns[c]);
    PyMem_RawFree(offset);
    PyBuffer_Release(&order);
    return result;
}

static PyObject *finish(Matcher *m, PyObject *args) { return spans_out(m, args, 1); }

static PyObject *snapshot(Matcher *m, PyObject *args) { return spans_out(m, args, 0); }

static void dealloc(Matcher *m) {
    clear(m);
    Py_TYPE(m)->tp_free((PyObject *)m);
}

static PyMethodDef matcher_methods[] = {
    {"feed", (PyCFunction)feed, METH_VARARGS, "Match the next events (file order)."},
    {"tensors", (PyCFunction)tensors, METH_NOARGS, "Each tensor's pid and closed spans, as bytes."},
    {"finish", (PyCFunction)finish, METH_VARARGS, "The spans of the tensors in order, as bytes; starts over."},
    {"snapshot", (PyCFunction)snapshot, METH_VARARGS, "The spans so far, as bytes; matching goes on."},
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


/* ---- merge(): items per pixel (a window of the viewer) or per bucket (a level of detail) ----
 *
 * merge(start, duration, longest, kind, depth, count, ranges, t0, pixel, width)
 *   -> (start, duration, longest, kind, depth, count, per_range)
 * Items in rows: start int64; duration and longest (None: the duration) uint32 or int64; kind
 * uint8, uint16 or uint32; depth uint8; count (None: 1 each) uint32. ranges: int64 (lo, hi)
 * pairs, each a row's items, by start. Per range and depth, an item at least a pixel long that
 * stands for one span stays itself; the others that start in the same cell (of pixel µs from
 * t0) merge into one: first start to last end, their counts summed, the longest member's
 * length and kind (ties: the larger kind). With width > 0 (a window of width pixels) items
 * that end before t0 are left out, cells are clipped to the window, and neighbouring merged
 * items of one kind less than a pixel apart join into one block. Out: start (int64), duration
 * and longest (int64), kind (as given), depth, count (uint32) of the merged items, a range's
 * by the position of their first item (so by start), one range after the other, and how many
 * each range got (int64). levels.merge_numpy is the same in numpy (many passes where this
 * takes one): the fallback and the reference of the tests.
 */

typedef struct {
    const char *data;
    int size; /* bytes an item; 0: absent */
} Field;

static inline int64_t get(Field f, Py_ssize_t i, int64_t absent) {
    switch (f.size) {
    case 0: return absent;
    case 1: return ((const uint8_t *)f.data)[i];
    case 2: return ((const uint16_t *)f.data)[i];
    case 4: return ((const uint32_t *)f.data)[i];
    default: return ((const int64_t *)f.data)[i];
    }
}

typedef struct { /* items being merged (a group), or groups joined (a block) */
    Py_ssize_t slot; /* its place among the range's outputs: where its first item came */
    int64_t start, end, longest, kind, count, cell;
    int wide; /* one span a pixel long or more: it stays itself */
} Group;

typedef struct { /* one depth of the range being merged */
    Group group, block;
    int64_t last_end, last_kind; /* of the group before, which a join compares with */
    int last_wide, grouping, blocking;
} Lane;

typedef struct {
    int64_t start, end, longest, kind, count;
    uint8_t depth, hole; /* hole: a group joined into the block before it */
} Slot;

typedef struct {
    Field start, duration, longest, kind, depth, count;
    int64_t t0, width;
    double pixel;
    Slot *slots;
    Py_ssize_t used;
    Lane lanes[256];
    uint8_t active[256];
    int actives;
} Merge;

static inline void heavier(int64_t *longest, int64_t *kind, int64_t other_longest, int64_t other_kind) {
    if (other_longest > *longest || (other_longest == *longest && other_kind > *kind)) {
        *longest = other_longest;
        *kind = other_kind;
    }
}

static void write_block(Merge *m, const Group *b, uint8_t depth) {
    m->slots[b->slot] = (Slot){b->start, b->end, b->longest, b->kind, b->count, depth, 0};
}

static void close_group(Merge *m, Lane *lane, uint8_t depth) {
    Group *g = &lane->group, *b = &lane->block;
    lane->grouping = 0;
    if (m->width > 0 && lane->blocking && g->kind == lane->last_kind && !g->wide && !lane->last_wide &&
        (double)(g->start - lane->last_end) < m->pixel) {
        if (g->end > b->end) b->end = g->end;
        heavier(&b->longest, &b->kind, g->longest, g->kind);
        b->count += g->count;
        m->slots[g->slot].hole = 1;
    } else {
        if (lane->blocking) write_block(m, b, depth);
        *b = *g;
        lane->blocking = 1;
    }
    lane->last_end = g->end;
    lane->last_kind = g->kind;
    lane->last_wide = g->wide;
}

static void take(Merge *m, Py_ssize_t i) {
    int64_t start = get(m->start, i, 0), duration = get(m->duration, i, 0), end = start + duration;
    if (m->width > 0 && end < m->t0) return; /* ends before the window */
    int64_t count = get(m->count, i, 1), longest = get(m->longest, i, duration), kind = get(m->kind, i, 0);
    uint8_t depth = (uint8_t)get(m->depth, i, 0);
    double at = (double)(start - m->t0) / m->pixel;
    int64_t cell = at >= 9e18 ? INT64_MAX : at <= -9e18 ? INT64_MIN : (int64_t)at;
    if (m->width > 0) cell = cell < 0 ? 0 : cell >= m->width ? m->width - 1 : cell;
    int wide = count == 1 && (double)duration >= m->pixel;
    Lane *lane = &m->lanes[depth];
    Group *g = &lane->group;
    if (lane->grouping && !wide && !g->wide && cell == g->cell) {
        if (end > g->end) g->end = end;
        heavier(&g->longest, &g->kind, longest, kind);
        g->count += count;
        return;
    }
    if (lane->grouping) close_group(m, lane, depth);
    else if (!lane->blocking) m->active[m->actives++] = depth;
    *g = (Group){m->used, start, end, longest, kind, count, cell, wide};
    m->slots[m->used++].hole = 0;
    lane->grouping = 1;
}

typedef struct {
    char *start, *duration, *longest, *kind, *depth, *count;
    Py_ssize_t size;
} Merged;

static void end_range(Merge *m, Merged *out) {
    for (int a = 0; a < m->actives; a++) {
        Lane *lane = &m->lanes[m->active[a]];
        if (lane->grouping) close_group(m, lane, m->active[a]);
        if (lane->blocking) write_block(m, &lane->block, m->active[a]);
        lane->blocking = 0;
    }
    m->actives = 0;
    for (Py_ssize_t k = 0; k < m->used; k++) {
        const Slot *s = &m->slots[k];
        if (s->hole) continue;
        Py_ssize_t j = out->size++;
        ((int64_t *)out->start)[j] = s->start;
        ((int64_t *)out->duration)[j] = s->end - s->start;
        ((int64_t *)out->longest)[j] = s->longest;
        if (m->kind.size == 1) ((uint8_t *)out->kind)[j] = (uint8_t)s->kind;
        else if (m->kind.size == 2) ((uint16_t *)out->kind)[j] = (uint16_t)s->kind;
        else ((uint32_t *)out->kind)[j] = (uint32_t)s->kind;
        ((uint8_t *)out->depth)[j] = s->depth;
        ((uint32_t *)out->count)[j] = (uint32_t)s->count;
    }
    m->used = 0;
}


/* Field of a column of n items: None (absent, where allowed) or a buffer of 1, 2, 4 or 8 bytes an item. */
static int field_of(PyObject *object, Py_buffer *view, Py_ssize_t n, int optional, int usual, Field *field) {
    *field = (Field){NULL, 0};
    if (optional && object == Py_None) return 0;
    if (PyObject_GetBuffer(object, view, PyBUF_SIMPLE) < 0) return -1;
    Py_ssize_t size = n ? view->len / n : usual; /* no items: any column will do */
    if ((n && view->len % n) || (size != 1 && size != 2 && size != 4 && size != 8)) {
        PyBuffer_Release(view);
        view->obj = NULL;
        PyErr_SetString(PyExc_ValueError, "merge: columns of 1, 2, 4 or 8 bytes an item, as many as start has");
        return -1;
    }
    *field = (Field){view->buf, (int)size};
    return 0;
}

/* The columns' Fields; n: items. -1 with an exception set. */
static int fields_of(Merge *m, PyObject **objects, Py_buffer *views, Py_ssize_t *n) {
    Field *fields[6] = {&m->start, &m->duration, &m->longest, &m->kind, &m->depth, &m->count};
    const int optional[6] = {0, 0, 1, 0, 0, 1}, usual[6] = {8, 8, 8, 1, 1, 4};
    if (PyObject_GetBuffer(objects[0], &views[0], PyBUF_SIMPLE) < 0) return -1;
    *n = views[0].len / 8;
    PyBuffer_Release(&views[0]);
    views[0].obj = NULL;
    for (int c = 0; c < 6; c++)
        if (field_of(objects[c], &views[c], *n, optional[c], usual[c], fields[c]) < 0) return -1;
    if (m->start.size != 8 || m->duration.size < 4 || (m->longest.size && m->longest.size < 4) ||
        m->kind.size > 4 || m->depth.size != 1 || (m->count.size && m->count.size != 4)) {
        PyErr_SetString(PyExc_ValueError, "merge: start int64, duration and longest uint32 or int64, kind "
                                          "uint8/16/32, depth uint8, count uint32");
        return -1;
    }
    return 0;
}

/* Checks the ranges against n items: the items they hold in all and in the longest; -1: bad. */
static int ranges_of(const Py_buffer *ranges, Py_ssize_t n, Py_ssize_t *total, Py_ssize_t *longest) {
    const int64_t *pairs = ranges->buf;
    *total = *longest = 0;
    if (ranges->len % 16) return -1;
    for (Py_ssize_t r = 0; r < ranges->len / 16; r++) {
        if (pairs[2 * r] < 0 || pairs[2 * r] > pairs[2 * r + 1] || pairs[2 * r + 1] > n) return -1;
        *total += pairs[2 * r + 1] - pairs[2 * r];
        if (pairs[2 * r + 1] - pairs[2 * r] > *longest) *longest = pairs[2 * r + 1] - pairs[2 * r];
    }
    return 0;
}

static PyObject *merged_columns(const Merge *m, const Merged *out, PyObject *per_range) {
    Py_ssize_t n = out->size;
    return Py_BuildValue("(y#y#y#y#y#y#N)", out->start, n * 8, out->duration, n * 8, out->longest, n * 8,
                         out->kind, n * (m->kind.size ? m->kind.size : 1), out->depth, n, out->count, n * 4, per_range);
}

static PyObject *merge(PyObject *Py_UNUSED(module), PyObject *args) {
    PyObject *objects[6], *result = NULL, *per_range = NULL;
    Py_buffer views[6], ranges;
    long long t0, width;
    double pixel;
    for (int c = 0; c < 6; c++) views[c].obj = NULL;
    if (!PyArg_ParseTuple(args, "OOOOOOy*LdL", &objects[0], &objects[1], &objects[2], &objects[3], &objects[4],
                          &objects[5], &ranges, &t0, &pixel, &width))
        return NULL;
    Merge *m = PyMem_RawCalloc(1, sizeof(Merge));
    Merged out = {NULL, NULL, NULL, NULL, NULL, NULL, 0};
    Py_ssize_t n = 0, total = 0, longest = 0;
    if (!m) {
        PyErr_NoMemory();
        goto done;
    }
    if (fields_of(m, objects, views, &n) < 0) goto done;
    if (!(pixel > 0) || ranges_of(&ranges, n, &total, &longest) < 0) {
        PyErr_SetString(PyExc_ValueError, "merge: ranges are int64 (lo, hi) pairs within the items; pixel > 0");
        goto done;
    }
    *m = (Merge){m->start, m->duration, m->longest, m->kind, m->depth, m->count, t0, width, pixel};
    m->slots = PyMem_RawMalloc((longest + 1) * sizeof(Slot));
    char **columns[6] = {&out.start, &out.duration, &out.longest, &out.kind, &out.depth, &out.count};
    const int widths[6] = {8, 8, 8, 4, 1, 4};
    for (int c = 0; c < 6; c++) *columns[c] = PyMem_RawMalloc((total + 1) * widths[c]);
    per_range = PyBytes_FromStringAndSize(NULL, ranges.len / 2);
    if (!m->slots || !out.start || !out.duration || !out.longest || !out.kind || !out.depth || !out.count) {
        PyErr_NoMemory();
        goto done;
    }
    if (!per_range) goto done;
    const int64_t *pairs = ranges.buf;
    int64_t *got = (int64_t *)PyBytes_AS_STRING(per_range);
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t r = 0; r < ranges.len / 16; r++) {
        Py_ssize_t before = out.size;
        for (Py_ssize_t i = pairs[2 * r]; i < pairs[2 * r + 1]; i++) take(m, i);
        end_range(m, &out);
        got[r] = out.size - before;
    }
    Py_END_ALLOW_THREADS
    result = merged_columns(m, &out, per_range);
    per_range = NULL;
done:
    Py_XDECREF(per_range);
    for (int c = 0; c < 6; c++)
        if (views[c].obj) PyBuffer_Release(&views[c]);
    PyBuffer_Release(&ranges);
    PyMem_RawFree(out.start); PyMem_RawFree(out.duration); PyMem_RawFree(out.longest);
    PyMem_RawFree(out.kind); PyMem_RawFree(out.depth); PyMem_RawFree(out.count);
    if (m) PyMem_RawFree(m->slots);
    PyMem_RawFree(m);
    return result;
}

static PyObject *trim(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(ignored)) {
    int released = 0;
#ifdef __GLIBC__
    Py_BEGIN_ALLOW_THREADS
    released = malloc_trim(0);
    Py_END_ALLOW_THREADS
#endif
    return PyBool_FromLong(released);
}

static PyMethodDef module_methods[] = {
    {"trim", trim, METH_NOARGS, "Give the heap's free pages back to the system (glibc), where it can."},
    {"merge", merge, METH_VARARGS, "Items merged per pixel or per bucket (see the comment above merge)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_match", NULL, -1, module_methods};

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
