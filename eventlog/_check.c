/* The default mode's in-place edit check, in C.
 *
 * A flushed message is remembered as a *record*: one tuple whose first item is a bytes
 * "shape" (the message's containers and leaf kinds in pre-order, with lengths) and whose
 * other items are the message's leaves (dict keys, strings, numbers) as the very objects
 * the caller gave.  The tuple holds those objects, so none of their addresses can be
 * reused while the record lives.  `first_changed` walks each live message beside its
 * record: a leaf that is the same object is unchanged (strings and numbers are
 * immutable); one that is not is compared exactly (same type, same value, same sign of
 * zero), so nothing whose canonical bytes differ ever passes, and containers are checked
 * entry by entry.  No Python code runs during a walk: only exact dicts, lists, tuples,
 * strings, ints, floats, bools and None are recorded (anything else makes the message
 * unrecordable, and the caller re-encodes it every time).
 *
 * eventlog/snapshot.py holds the pure-Python check with the same answers (copies compared
 * with ==); the test suite fuzzes the two against each other.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <string.h>

enum {
    TAG_DICT = 'd',
    TAG_LIST = 'l',
    TAG_TUPLE = 't',
    TAG_STR = 's',
    TAG_NONE = 'z',
    TAG_FRACTION = 'f', /* a float with a fraction: no int, bool or other float equals it */
    TAG_NUMBER = 'n',   /* int, bool or whole float: equal only to one of its type, value and sign */
};

typedef struct {
    unsigned char *data;
    Py_ssize_t len, cap;
    PyObject *leaves; /* list */
    int max_depth;
} Builder;

static int put_byte(Builder *b, unsigned char c) {
    if (b->len == b->cap) {
        Py_ssize_t cap = b->cap ? b->cap * 2 : 64;
        unsigned char *grown = PyMem_Realloc(b->data, (size_t)cap);
        if (grown == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        b->data = grown;
        b->cap = cap;
    }
    b->data[b->len++] = c;
    return 0;
}

static int put_length(Builder *b, Py_ssize_t n) {
    do {
        unsigned char c = (unsigned char)(n & 0x7f);
        n >>= 7;
        if (put_byte(b, n ? (unsigned char)(c | 0x80) : c) < 0) return -1;
    } while (n);
    return 0;
}

/* 1: recorded; 0: not recordable; -1: error set. */
static int build(Builder *b, PyObject *value, int depth) {
    PyTypeObject *type = Py_TYPE(value);
    if (type == &PyUnicode_Type) {
        if (put_byte(b, TAG_STR) < 0) return -1;
        return PyList_Append(b->leaves, value) < 0 ? -1 : 1;
    }
    if (value == Py_None) return put_byte(b, TAG_NONE) < 0 ? -1 : 1;
    if (depth > b->max_depth) return 0;
    if (type == &PyDict_Type || type == &PyList_Type || type == &PyTuple_Type) {
        if (type == &PyDict_Type) {
            Py_ssize_t pos = 0;
            PyObject *key, *item;
            if (put_byte(b, TAG_DICT) < 0 || put_length(b, PyDict_GET_SIZE(value)) < 0) return -1;
            while (PyDict_Next(value, &pos, &key, &item)) {
                int r;
                if (Py_TYPE(key) != &PyUnicode_Type) return 0;
                if (PyList_Append(b->leaves, key) < 0) return -1;
                Py_INCREF(item);
                r = build(b, item, depth + 1);
                Py_DECREF(item);
                if (r != 1) return r;
            }
            return 1;
        }
        Py_ssize_t n = Py_SIZE(value);
        PyObject **items = type == &PyList_Type ? ((PyListObject *)value)->ob_item : ((PyTupleObject *)value)->ob_item;
        if (put_byte(b, type == &PyList_Type ? TAG_LIST : TAG_TUPLE) < 0 || put_length(b, n) < 0) return -1;
        for (Py_ssize_t i = 0; i < n; i++) {
            int r = build(b, items[i], depth + 1);
            if (r != 1) return r;
        }
        return 1;
    }
    if (type == &PyFloat_Type) {
        double x = PyFloat_AS_DOUBLE(value);
        int fraction = isnan(x) || isinf(x) || fmod(x, 1.0) != 0.0; /* as Python's `value % 1.0` is truthy */
        if (put_byte(b, fraction ? TAG_FRACTION : TAG_NUMBER) < 0) return -1;
        return PyList_Append(b->leaves, value) < 0 ? -1 : 1;
    }
    if (type == &PyLong_Type || type == &PyBool_Type) {
        if (put_byte(b, TAG_NUMBER) < 0) return -1;
        return PyList_Append(b->leaves, value) < 0 ? -1 : 1;
    }
    return 0;
}

/* Messages of one kind share one shape ({"role", "content", "timestamp"}, a tool call ...):
 * one bytes object per shape, not per message, saves memory and keeps the shapes walked in
 * a flush hot in the CPU's cache.  Bounded, so odd messages cannot grow it without end. */
#define SHAPES_KEPT 4096
static PyObject *shapes; /* dict: shape -> the same shape */

static PyObject *shared_shape(const unsigned char *data, Py_ssize_t len) {
    PyObject *shape = PyBytes_FromStringAndSize((const char *)data, len), *found;
    if (shape == NULL || shapes == NULL) return shape;
    found = PyDict_GetItemWithError(shapes, shape);
    if (found != NULL) {
        Py_DECREF(shape);
        return Py_NewRef(found);
    }
    if (PyErr_Occurred()) {
        Py_DECREF(shape);
        return NULL;
    }
    if (PyDict_GET_SIZE(shapes) < SHAPES_KEPT && PyDict_SetItem(shapes, shape, shape) < 0) {
        Py_DECREF(shape);
        return NULL;
    }
    return shape;
}

static PyObject *record(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    int max_depth;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "record(message, max_depth)");
        return NULL;
    }
    long depth = PyLong_AsLong(args[1]);
    if (depth == -1 && PyErr_Occurred()) return NULL;
    max_depth = depth > 1000 ? 1000 : (int)depth;
    if (Py_TYPE(args[0]) != &PyDict_Type) Py_RETURN_NONE;
    Builder b = {NULL, 0, 0, PyList_New(0), max_depth};
    if (b.leaves == NULL) return NULL;
    int r = build(&b, args[0], 0);
    PyObject *out = NULL;
    if (r == 1) {
        Py_ssize_t n = PyList_GET_SIZE(b.leaves);
        out = PyTuple_New(n + 1);
        if (out != NULL) {
            PyObject *shape = shared_shape(b.data, b.len);
            if (shape == NULL) {
                Py_CLEAR(out);
            } else {
                PyTuple_SET_ITEM(out, 0, shape);
                for (Py_ssize_t i = 0; i < n; i++) {
                    PyObject *leaf = PyList_GET_ITEM(b.leaves, i);
                    Py_INCREF(leaf);
                    PyTuple_SET_ITEM(out, i + 1, leaf);
                }
            }
        }
    } else if (r == 0) {
        out = Py_NewRef(Py_None);
    }
    PyMem_Free(b.data);
    Py_DECREF(b.leaves);
    return out;
}

typedef struct {
    const unsigned char *shape;
    Py_ssize_t pos, len;
    PyObject **leaves;
    Py_ssize_t leaf, nleaves;
} Cursor;

static int read_length(Cursor *c, Py_ssize_t *n) {
    Py_ssize_t value = 0;
    int shift = 0;
    for (;;) {
        if (c->pos >= c->len || shift > 56) return 0;
        unsigned char byte = c->shape[c->pos++];
        value |= (Py_ssize_t)(byte & 0x7f) << shift;
        if (!(byte & 0x80)) break;
        shift += 7;
    }
    *n = value;
    return 1;
}

static PyObject *next_leaf(Cursor *c) { return c->leaf < c->nleaves ? c->leaves[c->leaf++] : NULL; }

static int same_number(PyObject *recorded, PyObject *live) {
    if (live == recorded) return 1;
    if (Py_TYPE(live) != Py_TYPE(recorded)) return 0;
    if (Py_TYPE(live) == &PyFloat_Type) {
        double a = PyFloat_AS_DOUBLE(recorded), b = PyFloat_AS_DOUBLE(live);
        return a == b && (a != 0.0 || signbit(a) == signbit(b));
    }
    if (Py_TYPE(live) == &PyLong_Type) {
        int overflow = 0;
        long long a = PyLong_AsLongLongAndOverflow(recorded, &overflow);
        if (!overflow) {
            long long b = PyLong_AsLongLongAndOverflow(live, &overflow);
            return !overflow && a == b;
        }
        return PyObject_RichCompareBool(recorded, live, Py_EQ); /* exact ints: no Python code runs */
    }
    return 0; /* bools are singletons: only the same object is the same bool */
}

/* 1: unchanged; 0: changed; -1: error set. */
static int walk(Cursor *c, PyObject *live, int depth) {
    if (c->pos >= c->len) return 0;
    unsigned char tag = c->shape[c->pos++];
    PyObject *leaf;
    Py_ssize_t n;
    switch (tag) {
    case TAG_STR:
        if ((leaf = next_leaf(c)) == NULL) return 0;
        if (live == leaf) return 1;
        if (Py_TYPE(live) != &PyUnicode_Type) return 0;
        return PyUnicode_Compare(leaf, live) == 0 ? 1 : (PyErr_Occurred() ? -1 : 0);
    case TAG_NONE:
        return live == Py_None;
    case TAG_FRACTION:
        if ((leaf = next_leaf(c)) == NULL) return 0;
        return live == leaf || (Py_TYPE(live) == &PyFloat_Type && PyFloat_AS_DOUBLE(live) == PyFloat_AS_DOUBLE(leaf));
    case TAG_NUMBER:
        if ((leaf = next_leaf(c)) == NULL) return 0;
        return same_number(leaf, live);
    case TAG_DICT: {
        if (!read_length(c, &n)) return 0;
        if (Py_TYPE(live) != &PyDict_Type || PyDict_GET_SIZE(live) != n) return 0;
        /* First in step with the dict's own order (its entries are read in turn, no key is
         * hashed): the common case, a dict that was neither rebuilt nor reordered. */
        Cursor saved = *c;
        Py_ssize_t pos = 0, i;
        PyObject *key, *item;
        for (i = 0; i < n; i++) {
            PyObject *recorded = next_leaf(c);
            int r;
            if (recorded == NULL || !PyDict_Next(live, &pos, &key, &item)) return 0;
            if (key != recorded) break;
            Py_INCREF(item);
            r = walk(c, item, depth + 1);
            Py_DECREF(item);
            if (r != 1) return r;
        }
        if (i == n) return 1;
        /* Another order or other key objects: look each recorded key up, as dict == does. */
        *c = saved;
        for (i = 0; i < n; i++) {
            PyObject *key = next_leaf(c), *item;
            int r;
            if (key == NULL) return 0;
            item = PyDict_GetItemWithError(live, key); /* an exact str key: hashing runs no Python code */
            if (item == NULL) return PyErr_Occurred() ? -1 : 0;
            Py_INCREF(item);
            r = walk(c, item, depth + 1);
            Py_DECREF(item);
            if (r != 1) return r;
        }
        return 1;
    }
    case TAG_LIST:
    case TAG_TUPLE: {
        if (!read_length(c, &n)) return 0;
        if (Py_TYPE(live) != (tag == TAG_LIST ? &PyList_Type : &PyTuple_Type) || Py_SIZE(live) != n) return 0;
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *item = tag == TAG_LIST ? PyList_GET_ITEM(live, i) : PyTuple_GET_ITEM(live, i);
            int r;
            Py_INCREF(item);
            r = walk(c, item, depth + 1);
            Py_DECREF(item);
            if (r != 1) return r;
        }
        return 1;
    }
    default:
        return 0;
    }
}

/* 1: `live` is what `rec` recorded; 0: it is not (or `rec` is not a record); -1: error set. */
static int matches(PyObject *rec, PyObject *live) {
    if (Py_TYPE(rec) != &PyTuple_Type || PyTuple_GET_SIZE(rec) < 1) return 0;
    PyObject *shape = PyTuple_GET_ITEM(rec, 0);
    if (Py_TYPE(shape) != &PyBytes_Type) return 0;
    Cursor c = {(const unsigned char *)PyBytes_AS_STRING(shape), 0, PyBytes_GET_SIZE(shape),
                ((PyTupleObject *)rec)->ob_item + 1, 0, PyTuple_GET_SIZE(rec) - 1};
    int r = walk(&c, live, 0);
    return r == 1 ? (c.pos == c.len && c.leaf == c.nleaves) : r;
}

static PyObject *first_changed(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    Py_ssize_t start, stop;
    if (nargs != 4 || !PyList_Check(args[0]) || !PyList_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "first_changed(records: list, messages: list, start, stop)");
        return NULL;
    }
    start = PyLong_AsSsize_t(args[2]);
    if (start == -1 && PyErr_Occurred()) return NULL;
    stop = PyLong_AsSsize_t(args[3]);
    if (stop == -1 && PyErr_Occurred()) return NULL;
    PyObject *records = args[0], *messages = args[1];
    for (Py_ssize_t i = start < 0 ? 0 : start; i < stop; i++) {
        /* Both lists may be changed by another thread between items: index them afresh. */
        if (i >= PyList_GET_SIZE(records) || i >= PyList_GET_SIZE(messages)) return PyLong_FromSsize_t(i);
        PyObject *rec = PyList_GET_ITEM(records, i), *live = PyList_GET_ITEM(messages, i);
        Py_INCREF(rec);
        Py_INCREF(live);
        int r = matches(rec, live);
        Py_DECREF(rec);
        Py_DECREF(live);
        if (r < 0) PyErr_Clear(); /* the caller looks closer at this message */
        if (r != 1) return PyLong_FromSsize_t(i);
    }
    return PyLong_FromSsize_t(stop);
}

static PyMethodDef methods[] = {
    {"record", (PyCFunction)(void (*)(void))record, METH_FASTCALL,
     "record(message, max_depth) -> tuple | None: what first_changed compares the message with later "
     "(None when the message holds anything but exact JSON-like values, or nests deeper than max_depth)."},
    {"first_changed", (PyCFunction)(void (*)(void))first_changed, METH_FASTCALL,
     "first_changed(records, messages, start, stop) -> int: the first index in start..stop-1 whose "
     "message is not what its record recorded (or whose record is not a record), else stop."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "eventlog._check", NULL, 0, methods};

PyMODINIT_FUNC PyInit__check(void) {
    if (shapes == NULL && (shapes = PyDict_New()) == NULL) return NULL;
    return PyModule_Create(&module);
}
