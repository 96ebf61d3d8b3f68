/* One pass over Horovod Timeline bytes into columns: the fast path of hvd_magic.timeline.read.
 * The scan runs without the GIL, so the reader scans chunks on several threads.
 *
 * scan(buffer, final) -> (consumed, error_at, ph, name, ts, pid, dur, names, meta, sizes)
 *   ph:   bytes, one phase character per event
 *   name: bytes of int32 name ids (-1: no name), names: list of the distinct names
 *   ts, pid, dur: bytes of int64 (INT64_MIN: absent)
 *   meta: list of (event index, raw bytes of the "args" object) for metadata ("M") events
 *   sizes: bytes of int64 pairs (event index, tensor bytes) for the "E" events whose args give
 *          the tensor's dtype and shape (Horovod writes them where an operation on a tensor ends)
 *   consumed: bytes used; an event cut off at the end of a non-final buffer is left unconsumed
 *   error_at: -1, or the offset of the first byte that is not part of a JSON event
 * Strings with escapes, fractional numbers or anything unexpected give error_at >= 0 with
 * consumed at that event, so the caller can use its general reader from there.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define ABSENT INT64_MIN
#define TABLE_SIZE 65536 /* power of two: name interning */

typedef struct {
    char *data;
    Py_ssize_t size, capacity;
} Column;

static int push(Column *c, const void *value, Py_ssize_t width) {
    if (c->size + width > c->capacity) {
        Py_ssize_t capacity = c->capacity ? c->capacity * 2 : 1 << 16;
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

typedef struct {
    const char *text[TABLE_SIZE];
    Py_ssize_t length[TABLE_SIZE];
    int32_t id[TABLE_SIZE];
    int32_t count;
    const char *by_id[TABLE_SIZE / 2];
    Py_ssize_t length_by_id[TABLE_SIZE / 2];
} Names;

static int32_t intern(Names *names, const char *text, Py_ssize_t length) {
    uint64_t hash = 1469598103934665603ULL;
    for (Py_ssize_t i = 0; i < length; i++) hash = (hash ^ (unsigned char)text[i]) * 1099511628211ULL;
    for (uint64_t slot = hash & (TABLE_SIZE - 1);; slot = (slot + 1) & (TABLE_SIZE - 1)) {
        if (!names->text[slot]) {
            if (names->count >= TABLE_SIZE / 2) return -2;
            names->by_id[names->count] = text;
            names->length_by_id[names->count] = length;
            names->text[slot] = text;
            names->length[slot] = length;
            names->id[slot] = names->count++;
            return names->id[slot];
        }
        if (names->length[slot] == length && memcmp(names->text[slot], text, length) == 0) return names->id[slot];
    }
}

static Py_ssize_t skip_space(const char *s, Py_ssize_t i, Py_ssize_t n) {
    while (i < n && (s[i] == ' ' || s[i] == '\n' || s[i] == '\r' || s[i] == '\t')) i++;
    return i;
}

/* End of a JSON string starting at s[i] == '"'; -1 if cut off, -2 if it has escapes. */
static Py_ssize_t string_end(const char *s, Py_ssize_t i, Py_ssize_t n) {
    for (i++; i < n; i++) {
        if (s[i] == '"') return i;
        if (s[i] == '\\') return -2;
    }
    return -1;
}

/* End (exclusive) of the JSON value at s[i]: string, object, array or literal; -1 cut off, -2 bad. */
static Py_ssize_t value_end(const char *s, Py_ssize_t i, Py_ssize_t n) {
    if (i >= n) return -1;
    if (s[i] == '"') {
        Py_ssize_t e = string_end(s, i, n);
        return e < 0 ? e : e + 1;
    }
    if (s[i] == '{' || s[i] == '[') {
        int depth = 0;
        for (; i < n; i++) {
            if (s[i] == '"') {
                Py_ssize_t e = string_end(s, i, n);
                if (e < 0) return e;
                i = e;
            } else if (s[i] == '{' || s[i] == '[') depth++;
            else if (s[i] == '}' || s[i] == ']') {
                if (--depth == 0) return i + 1;
            }
        }
        return -1;
    }
    while (i < n && s[i] != ',' && s[i] != '}' && s[i] != ']' && s[i] != ' ' && s[i] != '\n') i++;
    return i < n ? i : -1;
}

/* An integer at s[i]; *ok = 0 if it is not a plain integer (fraction, exponent, garbage). */
static int64_t integer(const char *s, Py_ssize_t i, Py_ssize_t end, int *ok) {
    int negative = i < end && s[i] == '-';
    if (negative) i++;
    if (i >= end) { *ok = 0; return 0; }
    int64_t value = 0;
    for (; i < end; i++) {
        if (s[i] < '0' || s[i] > '9') { *ok = 0; return 0; }
        int digit = s[i] - '0';
        /* past int64: not ours to read (the constant first: the scan's hot loop) */
        if (value > (INT64_MAX - 9) / 10 && value > (INT64_MAX - digit) / 10) { *ok = 0; return 0; }
        value = value * 10 + digit;
    }
    *ok = 1;
    return negative ? -value : value;
}

#define KEY(text) (key_length == (Py_ssize_t)sizeof(text) - 1 && memcmp(s + key, text, key_length) == 0)

/* The next member of a JSON object, from *j (its first byte, or the closing brace at end - 1):
 * 1 with the key's and the value's bounds, *j moved past it and its comma; 0 after the last;
 * -1 when it is not a plain "key": value. */
static int next_member(const char *s, Py_ssize_t *j, Py_ssize_t end, Py_ssize_t *key,
                       Py_ssize_t *key_length, Py_ssize_t *value, Py_ssize_t *value_close) {
    if (*j >= end - 1) return 0;
    if (s[*j] != '"') return -1;
    Py_ssize_t key_close = string_end(s, *j, end);
    if (key_close < 0) return -1;
    *key = *j + 1;
    *key_length = key_close - *key;
    Py_ssize_t i = skip_space(s, key_close + 1, end);
    if (i >= end || s[i] != ':') return -1;
    *value = skip_space(s, i + 1, end);
    *value_close = value_end(s, *value, end);
    if (*value_close < 0) return -1;
    i = skip_space(s, *value_close, end);
    if (i < end - 1) {
        if (s[i] != ',') return -1;
        i = skip_space(s, i + 1, end);
    }
    *j = i;
    return 1;
}

/* Bytes per element of a dtype name ("float32", "HOROVOD_FLOAT32", "bool"...): its trailing bit
 * count over 8; -1 when it has none. */
static int64_t element_width(const char *s, Py_ssize_t n) {
    if ((n >= 4 && (memcmp(s + n - 4, "bool", 4) == 0 || memcmp(s + n - 4, "BOOL", 4) == 0))) return 1;
    Py_ssize_t i = n;
    while (i > 0 && s[i - 1] >= '0' && s[i - 1] <= '9') i--;
    if (i == n || n - i > 3) return -1;
    int64_t bits = 0;
    for (; i < n; i++) bits = bits * 10 + (s[i] - '0');
    return bits % 8 ? -1 : bits / 8;
}

/* Elements of a shape written "[3, 10]" ("[]": a scalar); -1 when it is not such a list. */
static int64_t element_count(const char *s, Py_ssize_t n) {
    if (n < 2 || s[0] != '[' || s[n - 1] != ']') return -1;
    int64_t count = 1, dim = -1;
    int dims = 0;
    for (Py_ssize_t i = 1; i < n; i++) {
        if (s[i] >= '0' && s[i] <= '9') {
            if (dim > (int64_t)1 << 40) return -1;
            dim = (dim < 0 ? 0 : dim) * 10 + (s[i] - '0');
        } else if (s[i] == ',' || s[i] == ']') {
            if (dim < 0) return s[i] == ']' && !dims ? 1 : -1; /* "[]", or an empty dimension */
            if (count > ((int64_t)1 << 50) / (dim ? dim : 1)) return -1;
            count *= dim;
            dim = -1;
            dims++;
        } else if (s[i] != ' ') return -1;
    }
    return count;
}

/* The bytes of the tensor an "args" object {"dtype": ..., "shape": ...} describes; -1 if none. */
static int64_t tensor_bytes(const char *s, Py_ssize_t at, Py_ssize_t end) {
    if (s[at] != '{') return -1;
    int64_t width = -1, count = -1;
    Py_ssize_t j = skip_space(s, at + 1, end), key, key_length, value, value_close;
    int found;
    while ((found = next_member(s, &j, end, &key, &key_length, &value, &value_close)) > 0) {
        if (s[value] == '"' && KEY("dtype")) width = element_width(s + value + 1, value_close - value - 2);
        else if (s[value] == '"' && KEY("shape")) count = element_count(s + value + 1, value_close - value - 2);
    }
    return found == 0 && width > 0 && count >= 0 ? width * count : -1;
}

typedef struct {
    const char *s;
    Py_ssize_t n;
    int final;
    Py_ssize_t consumed, error_at, events;
    Column ph, name, ts, pid, dur, meta; /* meta: (event index, args offset, args length) int64 triples */
    Column sizes;                        /* (event index, tensor bytes) int64 pairs */
    Names *names;
    int out_of_memory;
} Scan;

/* The scan itself touches no Python object, so it runs without the GIL (chunks in parallel). */
static void scan_events(Scan *r) {
    const char *s = r->s;
    Py_ssize_t n = r->n, i = 0;
    r->error_at = -1;
    for (;;) {
        while (i < n && (s[i] == ',' || s[i] == ' ' || s[i] == '\n' || s[i] == '\r' || s[i] == '\t')) i++;
        r->consumed = i;
        if (i >= n || s[i] == ']') { r->consumed = n; return; }
        if (s[i] != '{') { r->error_at = i; return; }
        Py_ssize_t event_end = value_end(s, i, n);
        if (event_end == -1) return; /* cut off: left unconsumed for the caller */
        if (event_end < 0) { r->error_at = i; return; }
        char phase = 0;
        int32_t name_id = -1;
        int64_t ts_value = ABSENT, pid_value = ABSENT, dur_value = ABSENT;
        Py_ssize_t args_at = -1, args_end = -1, j = skip_space(s, i + 1, event_end);
        Py_ssize_t key, key_length, at, end; /* a member's key and value */
        int bad = 0, found;
        while (!bad && (found = next_member(s, &j, event_end, &key, &key_length, &at, &end)) != 0) {
            int ok = 1;
            if (found < 0) ok = 0;
            else if (KEY("ph")) {
                if (s[at] != '"' || end - at != 3) ok = 0; else phase = s[at + 1];
            } else if (KEY("name")) {
                if (s[at] != '"' || (name_id = intern(r->names, s + at + 1, end - at - 2)) < 0) ok = 0;
            } else if (KEY("ts")) ts_value = integer(s, at, end, &ok);
            else if (KEY("pid")) pid_value = integer(s, at, end, &ok);
            else if (KEY("dur")) dur_value = integer(s, at, end, &ok);
            else if (KEY("args")) { args_at = at; args_end = end; }
            bad = !ok;
        }
        if (bad || !phase) { r->error_at = i; return; }
        if (push(&r->ph, &phase, 1) || push(&r->name, &name_id, 4) || push(&r->ts, &ts_value, 8) ||
            push(&r->pid, &pid_value, 8) || push(&r->dur, &dur_value, 8)) { r->out_of_memory = 1; return; }
        if (phase == 'M' && args_at >= 0) {
            int64_t triple[3] = {r->events, args_at, args_end - args_at};
            if (push(&r->meta, triple, sizeof triple)) { r->out_of_memory = 1; return; }
        }
        if (phase == 'E' && args_at >= 0) {
            int64_t pair[2] = {r->events, tensor_bytes(s, args_at, args_end)};
            if (pair[1] >= 0 && push(&r->sizes, pair, sizeof pair)) { r->out_of_memory = 1; return; }
        }
        r->events++;
        i = event_end;
    }
}

static PyObject *column(Column *c) { return PyBytes_FromStringAndSize(c->data ? c->data : "", c->size); }

static PyObject *scan(PyObject *self, PyObject *args) {
    Py_buffer view;
    int final;
    if (!PyArg_ParseTuple(args, "y*p", &view, &final)) return NULL;
    Scan r = {0};
    r.s = view.buf;
    r.n = view.len;
    r.final = final;
    r.names = PyMem_RawCalloc(1, sizeof(Names));
    PyObject *result = NULL, *names = NULL, *meta = NULL;
    if (!r.names) { PyErr_NoMemory(); goto done; }
    Py_BEGIN_ALLOW_THREADS
    scan_events(&r);
    Py_END_ALLOW_THREADS
    if (r.out_of_memory) { PyErr_NoMemory(); goto done; }
    names = PyList_New(r.names->count);
    meta = PyList_New(0);
    if (!names || !meta) goto done;
    for (int32_t k = 0; k < r.names->count; k++) {
        PyObject *name = PyUnicode_DecodeUTF8(r.names->by_id[k], r.names->length_by_id[k], "replace");
        if (!name) goto done;
        PyList_SET_ITEM(names, k, name);
    }
    for (Py_ssize_t k = 0; k < r.meta.size / (Py_ssize_t)(3 * sizeof(int64_t)); k++) {
        int64_t *t = (int64_t *)r.meta.data + 3 * k;
        PyObject *entry = Py_BuildValue("(Ly#)", (long long)t[0], r.s + t[1], (Py_ssize_t)t[2]);
        if (!entry || PyList_Append(meta, entry) < 0) { Py_XDECREF(entry); goto done; }
        Py_DECREF(entry);
    }
    PyObject *ph = column(&r.ph), *name = column(&r.name), *ts = column(&r.ts), *pid = column(&r.pid),
             *dur = column(&r.dur), *sizes = column(&r.sizes);
    if (ph && name && ts && pid && dur && sizes)
        result = Py_BuildValue(
            "(nnOOOOOOOO)", r.consumed, r.error_at, ph, name, ts, pid, dur, names, meta, sizes);
    Py_XDECREF(ph); Py_XDECREF(name); Py_XDECREF(ts); Py_XDECREF(pid); Py_XDECREF(dur);
    Py_XDECREF(sizes);
done:
    PyMem_RawFree(r.ph.data); PyMem_RawFree(r.name.data); PyMem_RawFree(r.ts.data);
    PyMem_RawFree(r.pid.data); PyMem_RawFree(r.dur.data); PyMem_RawFree(r.meta.data);
    PyMem_RawFree(r.sizes.data);
    PyMem_RawFree(r.names);
    Py_XDECREF(names);
    Py_XDECREF(meta);
    PyBuffer_Release(&view);
    return result;
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS, "Scan Horovod Timeline events into columns (see the file's comment)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_scan", NULL, -1, methods};

PyMODINIT_FUNC PyInit__scan(void) { return PyModule_Create(&module); }
