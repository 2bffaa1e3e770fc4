/* The default mode's in-place edit check, in C.
 *
 * A flushed message is remembered as a *record*: a small object holding a *shape* and the
 * message's value leaves (its strings and numbers, the very objects the caller gave) in
 * pre-order.  The shape is shared by every message of one kind ({"role", "content",
 * "timestamp"}, a tool call ...): a bytes code of the message's containers and leaf kinds
 * with their lengths, and the objects every such message has in common, its dict keys and
 * its interned strings (a role, a tool's name, a finish reason).  A record holds a strong
 * reference to each of its leaves and to its shape, which holds its own objects, so no
 * address a record compares with can be reused while the record lives.
 *
 * `first_changed` walks each live message beside its record.  A leaf that is the same
 * object is unchanged (strings and numbers are immutable) and costs one pointer
 * comparison; the text itself is never read.  One that is not is compared exactly: the
 * same type (exact str, int, float, bool: never a subclass, a Decimal or another number
 * type), the same value, the same sign of zero.  So nothing whose canonical bytes differ
 * ever passes.  Containers must be the exact dict, list or tuple recorded, of the same
 * length, and a dict's keys the same (in any order: canonical bytes sort them).
 *
 * On CPython 3.11 that walk is mostly skipped: a record also lists, in pre-order, each of the
 * message's containers with its address, a dict with its version (see USE_VERSIONS), a list or
 * tuple with its items' addresses.  A dict found at its recorded address with its recorded
 * version is the recorded dict, unchanged, so none of its entries is read; a list is compared
 * with its recorded items in one memcmp of their addresses.  So a message is checked by a tight
 * loop over a few words per container.  Anything else falls back to the walk above.
 *
 * No Python code runs during a walk, nor can the garbage collector: only exact built-in
 * types are looked at, compared with C functions that call no Python code and allocate
 * nothing.  So the messages cannot change under the walk and it needs no references of its
 * own.  Only exact dicts (with exact str keys), lists, tuples, strings, ints, floats, bools
 * and None are recorded, nested at most `max_depth` deep (a cycle is nesting without end);
 * anything else makes the message unrecordable, and the caller re-encodes it every time.
 *
 * eventlog/snapshot.py holds the pure-Python check with the same answers (copies compared
 * with ==); the test suite fuzzes the two against each other.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stddef.h>
#include <string.h>

/* On CPython 3.11 a dict's ma_version_tag (PEP 509) changes with every change to the dict, to a
 * value no dict had before: a dict at the recorded address with the recorded version is the
 * recorded dict, unchanged, and its entries need not be read.  (3.12 deprecates the field: from
 * 3.12 on, and where pointers are not 64 bits, every dict is read.) */
#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030C0000 && SIZEOF_VOID_P == 8
#define USE_VERSIONS 1
#else
#define USE_VERSIONS 0
#endif

#if defined(__GNUC__) || defined(__clang__)
#define PREFETCH(p) __builtin_prefetch((const void *)(p))
#else
#define PREFETCH(p) ((void)0)
#endif

enum {
    TAG_DICT = 'd',     /* + length; then per entry its key (a shape object) and its value */
    TAG_LIST = 'l',     /* + length; then its items */
    TAG_TUPLE = 't',    /* + length; then its items */
    TAG_STR = 's',      /* a string leaf of the record */
    TAG_CONST = 'k',    /* an interned string, held by the shape */
    TAG_NONE = 'z',
    TAG_TRUE = 'T',
    TAG_FALSE = 'F',
    TAG_FRACTION = 'f', /* a float with a fraction: no int, bool or other float equals it */
    TAG_NUMBER = 'n',   /* int or whole float: equal only to one of its type, value and sign */
};

/* ---- records ---------------------------------------------------------------------------- */

/* A shape's code starts with two lengths: how many leaves a record of that shape holds, and
 * how many slots its list of containers takes (USE_VERSIONS); then the tags in pre-order. */
typedef struct {
    Py_ssize_t leaves, containers;
} Counts;

/* A record's list of containers, in pre-order: for a dict its address (tagged DICT in the low
 * bits, free in an object's address) and its version; for a list or tuple its address (tagged
 * LIST or TUPLE), its length and its items' addresses. */
enum { SLOT_DICT = 0, SLOT_LIST = 1, SLOT_TUPLE = 2, SLOT_KIND = 7 };

typedef struct {
    PyObject_HEAD       /* no size of its own: the shape's counts say how many slots follow */
    PyObject *shape;    /* tuple: (code bytes, key or constant objects in pre-order) */
    /* With USE_VERSIONS the list of containers (their addresses are never dereferenced unless
     * what holds them was found unchanged), first, so that checking an unchanged message reads
     * the record's first words only; then the leaves (strong references). */
    PyObject *slots[1];
} Record;

static int read_varint(const unsigned char **code, const unsigned char *end, Py_ssize_t *n) {
    Py_ssize_t value = 0;
    int shift = 0;
    for (;;) {
        if (*code >= end || shift > 56) return 0;
        unsigned char byte = *(*code)++;
        value |= (Py_ssize_t)(byte & 0x7f) << shift;
        if (!(byte & 0x80)) break;
        shift += 7;
    }
    *n = value;
    return 1;
}

/* The record's counts and its code after them. */
static int record_layout(Record *r, Counts *counts, const unsigned char **code, const unsigned char **end) {
    PyObject *bytes = PyTuple_GET_ITEM(r->shape, 0);
    *code = (const unsigned char *)PyBytes_AS_STRING(bytes);
    *end = *code + PyBytes_GET_SIZE(bytes);
    if (!read_varint(code, *end, &counts->leaves) || !read_varint(code, *end, &counts->containers)) return 0;
    return 1;
}

static void record_dealloc(Record *self) {
    Counts counts;
    const unsigned char *code, *end;
    if (self->shape != NULL) {
        if (record_layout(self, &counts, &code, &end))
            for (Py_ssize_t i = 0; i < counts.leaves; i++) Py_DECREF(self->slots[counts.containers + i]);
        Py_DECREF(self->shape);
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *record_repr(Record *self) {
    Counts counts;
    const unsigned char *code, *end;
    if (!record_layout(self, &counts, &code, &end)) counts.leaves = 0;
    return PyUnicode_FromFormat("<eventlog._check.Record, %zd leaves>", counts.leaves);
}

/* Not tracked by the garbage collector: a record refers only to strings, ints, floats and
 * its shape (a tuple of bytes and strings), none of which can refer back to anything. */
static PyTypeObject RecordType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "eventlog._check.Record",
    .tp_basicsize = offsetof(Record, slots),
    .tp_dealloc = (destructor)record_dealloc,
    .tp_repr = (reprfunc)record_repr,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "What a message was when it was flushed (see record()).",
};

/* ---- building a record ------------------------------------------------------------------ */

typedef struct {
    PyObject **items;
    Py_ssize_t len, cap;
} Refs; /* borrowed while the message is walked: no Python code runs meanwhile */

typedef struct {
    unsigned char *code;
    Py_ssize_t len, cap;
    Refs leaves, objects, containers; /* containers: slots of the list of containers (words) */
    int max_depth;
} Builder;

static int put_byte(Builder *b, unsigned char c) {
    if (b->len == b->cap) {
        Py_ssize_t cap = b->cap ? b->cap * 2 : 64;
        unsigned char *grown = PyMem_Realloc(b->code, (size_t)cap);
        if (grown == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        b->code = grown;
        b->cap = cap;
    }
    b->code[b->len++] = c;
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

static int put_ref(Refs *r, PyObject *value) {
    if (r->len == r->cap) {
        Py_ssize_t cap = r->cap ? r->cap * 2 : 16;
        PyObject **grown = PyMem_Realloc(r->items, (size_t)cap * sizeof(PyObject *));
        if (grown == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        r->items = grown;
        r->cap = cap;
    }
    r->items[r->len++] = value;
    return 0;
}

static int put_container(Builder *b, PyObject *value) {
#if USE_VERSIONS
    PyTypeObject *type = Py_TYPE(value);
    uintptr_t kind = type == &PyDict_Type ? SLOT_DICT : type == &PyList_Type ? SLOT_LIST : SLOT_TUPLE;
    if (((uintptr_t)value & SLOT_KIND) != 0) return 0; /* never so for an object's address */
    if (put_ref(&b->containers, (PyObject *)((uintptr_t)value | kind)) < 0) return -1;
    if (kind == SLOT_DICT)
        return put_ref(&b->containers, (PyObject *)(uintptr_t)((PyDictObject *)value)->ma_version_tag) < 0 ? -1 : 1;
    Py_ssize_t n = Py_SIZE(value);
    PyObject **items = kind == SLOT_LIST ? ((PyListObject *)value)->ob_item : ((PyTupleObject *)value)->ob_item;
    if (put_ref(&b->containers, (PyObject *)(uintptr_t)n) < 0) return -1;
    for (Py_ssize_t i = 0; i < n; i++)
        if (put_ref(&b->containers, items[i]) < 0) return -1;
#else
    (void)b;
    (void)value;
#endif
    return 1;
}

/* 1: recorded; 0: not recordable; -1: error set.  Allocates nothing the garbage collector
 * tracks (it could run Python code, which could change the message under the walk). */
static int build(Builder *b, PyObject *value, int depth) {
    PyTypeObject *type = Py_TYPE(value);
    if (type == &PyUnicode_Type) {
        if (PyUnicode_CHECK_INTERNED(value)) {
            if (put_byte(b, TAG_CONST) < 0 || put_ref(&b->objects, value) < 0) return -1;
            return 1;
        }
        if (put_byte(b, TAG_STR) < 0 || put_ref(&b->leaves, value) < 0) return -1;
        return 1;
    }
    if (value == Py_None) return put_byte(b, TAG_NONE) < 0 ? -1 : 1;
    if (depth > b->max_depth) return 0; /* as the pure-Python copy: strings and None at any depth */
    if (value == Py_True) return put_byte(b, TAG_TRUE) < 0 ? -1 : 1;
    if (value == Py_False) return put_byte(b, TAG_FALSE) < 0 ? -1 : 1;
    if (type == &PyFloat_Type) {
        double x = PyFloat_AS_DOUBLE(value);
        int fraction = isnan(x) || isinf(x) || fmod(x, 1.0) != 0.0; /* as Python's `value % 1.0` is truthy */
        if (put_byte(b, fraction ? TAG_FRACTION : TAG_NUMBER) < 0 || put_ref(&b->leaves, value) < 0) return -1;
        return 1;
    }
    if (type == &PyLong_Type) {
        if (put_byte(b, TAG_NUMBER) < 0 || put_ref(&b->leaves, value) < 0) return -1;
        return 1;
    }
    if (type == &PyDict_Type) {
        Py_ssize_t pos = 0;
        PyObject *key, *item;
        int r = put_container(b, value);
        if (r != 1) return r;
        if (put_byte(b, TAG_DICT) < 0 || put_length(b, PyDict_GET_SIZE(value)) < 0) return -1;
        while (PyDict_Next(value, &pos, &key, &item)) {
            int r;
            if (Py_TYPE(key) != &PyUnicode_Type) return 0;
            if (put_ref(&b->objects, key) < 0) return -1;
            if ((r = build(b, item, depth + 1)) != 1) return r;
        }
        return 1;
    }
    if (type == &PyList_Type || type == &PyTuple_Type) {
        Py_ssize_t n = Py_SIZE(value);
        PyObject **items = type == &PyList_Type ? ((PyListObject *)value)->ob_item : ((PyTupleObject *)value)->ob_item;
        int r = put_container(b, value);
        if (r != 1) return r;
        if (put_byte(b, type == &PyList_Type ? TAG_LIST : TAG_TUPLE) < 0 || put_length(b, n) < 0) return -1;
        for (Py_ssize_t i = 0; i < n; i++) {
            int r = build(b, items[i], depth + 1);
            if (r != 1) return r;
        }
        return 1;
    }
    return 0;
}

/* Messages of one kind share one shape: one tuple per kind, not per message, saves memory
 * and keeps the shapes walked in a flush hot in the CPU's cache.  Bounded, so odd messages
 * cannot grow the table without end (beyond it, a record has a shape of its own). */
#define SHAPES_KEPT 4096
static PyObject *shapes; /* dict: shape -> the same shape */

static unsigned char *put_varint(unsigned char *out, Py_ssize_t n) {
    do {
        unsigned char c = (unsigned char)(n & 0x7f);
        n >>= 7;
        *out++ = n ? (unsigned char)(c | 0x80) : c;
    } while (n);
    return out;
}

/* A new reference to the shared shape for the builder's code and objects (owned by the caller). */
static PyObject *shared_shape(Builder *b) {
    unsigned char header[30], *at = header, *code;
    at = put_varint(at, b->leaves.len);
    at = put_varint(at, b->containers.len);
    PyObject *shape = PyTuple_New(b->objects.len + 1), *found, *bytes;
    if (shape == NULL) return NULL;
    bytes = PyBytes_FromStringAndSize(NULL, (at - header) + b->len);
    if (bytes == NULL) {
        Py_DECREF(shape);
        return NULL;
    }
    code = (unsigned char *)PyBytes_AS_STRING(bytes);
    memcpy(code, header, (size_t)(at - header));
    memcpy(code + (at - header), b->code, (size_t)b->len);
    PyTuple_SET_ITEM(shape, 0, bytes);
    for (Py_ssize_t i = 0; i < b->objects.len; i++) PyTuple_SET_ITEM(shape, i + 1, Py_NewRef(b->objects.items[i]));
    /* A tuple of bytes and exact strings: hashing and comparing it runs no Python code. */
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
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "record(message, max_depth)");
        return NULL;
    }
    long depth = PyLong_AsLong(args[1]);
    if (depth == -1 && PyErr_Occurred()) return NULL;
    if (Py_TYPE(args[0]) != &PyDict_Type) Py_RETURN_NONE;
    Builder b = {0};
    b.max_depth = depth < 0 ? 0 : depth > 1000 ? 1000 : (int)depth;
    PyObject *out = NULL;
    int r = build(&b, args[0], 0);
    if (r == 0) {
        out = Py_NewRef(Py_None);
    } else if (r == 1) {
        Py_ssize_t nleaves = b.leaves.len, slots = nleaves;
#if USE_VERSIONS
        slots += b.containers.len;
#endif
        /* Own every leaf and object first: allocating the shape may run the garbage collector. */
        Record *rec = PyObject_Malloc(offsetof(Record, slots) + (size_t)slots * sizeof(PyObject *));
        if (rec == NULL) {
            PyErr_NoMemory();
        } else {
            PyObject_Init((PyObject *)rec, &RecordType);
            rec->shape = NULL;
            PyObject **leaves = rec->slots + b.containers.len;
            for (Py_ssize_t i = 0; i < nleaves; i++) leaves[i] = Py_NewRef(b.leaves.items[i]);
#if USE_VERSIONS
            memcpy(rec->slots, b.containers.items, (size_t)b.containers.len * sizeof(PyObject *));
#endif
            for (Py_ssize_t i = 0; i < b.objects.len; i++) Py_INCREF(b.objects.items[i]);
            rec->shape = shared_shape(&b);
            for (Py_ssize_t i = 0; i < b.objects.len; i++) Py_DECREF(b.objects.items[i]);
            if (rec->shape == NULL) {
                for (Py_ssize_t i = 0; i < nleaves; i++) Py_DECREF(leaves[i]);
                Py_TYPE(rec)->tp_free((PyObject *)rec);
            } else {
                out = (PyObject *)rec;
            }
        }
    }
    PyMem_Free(b.code);
    PyMem_Free(b.leaves.items);
    PyMem_Free(b.objects.items);
    PyMem_Free(b.containers.items);
    return out;
}

/* ---- checking a message against its record ---------------------------------------------- */

typedef struct {
    const unsigned char *code, *end;
    PyObject *const *objects;
    Py_ssize_t object, nobjects;
    PyObject *const *leaves;
    Py_ssize_t leaf, nleaves;
} Cursor;

static int read_length(Cursor *c, Py_ssize_t *n) {
    Py_ssize_t value = 0;
    int shift = 0;
    for (;;) {
        if (c->code >= c->end || shift > 56) return 0;
        unsigned char byte = *c->code++;
        value |= (Py_ssize_t)(byte & 0x7f) << shift;
        if (!(byte & 0x80)) break;
        shift += 7;
    }
    *n = value;
    return 1;
}

/* Two exact strings of the same text (PyUnicode_Compare on exact strings runs no Python code
 * and, unlike ==, allocates nothing). */
static int same_text(PyObject *a, PyObject *b) {
    if (a == b) return 1;
    if (Py_TYPE(b) != &PyUnicode_Type) return 0;
#if PY_VERSION_HEX < 0x030C0000
    if (!PyUnicode_IS_READY(a) || !PyUnicode_IS_READY(b)) return 0; /* a legacy string: "changed" is safe */
#endif
    if (PyUnicode_GET_LENGTH(a) != PyUnicode_GET_LENGTH(b) || PyUnicode_KIND(a) != PyUnicode_KIND(b)) return 0;
    return memcmp(PyUnicode_DATA(a), PyUnicode_DATA(b), (size_t)(PyUnicode_GET_LENGTH(a) * PyUnicode_KIND(a))) == 0;
}

static int same_number(PyObject *recorded, PyObject *live) {
    if (live == recorded) return 1;
    if (Py_TYPE(live) != Py_TYPE(recorded)) return 0;
    if (Py_TYPE(live) == &PyFloat_Type) {
        double a = PyFloat_AS_DOUBLE(recorded), b = PyFloat_AS_DOUBLE(live);
        return a == b && (a != 0.0 || signbit(a) == signbit(b));
    }
    /* Exact ints: compare their magnitudes and signs without converting anything. */
    int overflow = 0;
    long long a = PyLong_AsLongLongAndOverflow(recorded, &overflow);
    if (!overflow) {
        long long b = PyLong_AsLongLongAndOverflow(live, &overflow);
        return !overflow && a == b;
    }
    return PyObject_RichCompareBool(recorded, live, Py_EQ) == 1; /* exact ints: no Python code runs */
}

/* 1: unchanged; 0: changed. */
static int walk(Cursor *c, PyObject *live) {
    if (c->code >= c->end) return 0;
    unsigned char tag = *c->code++;
    Py_ssize_t n;
    switch (tag) {
    case TAG_STR:
        if (c->leaf >= c->nleaves) return 0;
        return same_text(c->leaves[c->leaf++], live);
    case TAG_CONST:
        if (c->object >= c->nobjects) return 0;
        return same_text(c->objects[c->object++], live);
    case TAG_NONE:
        return live == Py_None;
    case TAG_TRUE:
        return live == Py_True;
    case TAG_FALSE:
        return live == Py_False;
    case TAG_FRACTION: {
        if (c->leaf >= c->nleaves) return 0;
        PyObject *leaf = c->leaves[c->leaf++];
        return live == leaf || (Py_TYPE(live) == &PyFloat_Type && PyFloat_AS_DOUBLE(live) == PyFloat_AS_DOUBLE(leaf));
    }
    case TAG_NUMBER:
        if (c->leaf >= c->nleaves) return 0;
        return same_number(c->leaves[c->leaf++], live);
    case TAG_DICT: {
        if (!read_length(c, &n)) return 0;
        if (Py_TYPE(live) != &PyDict_Type || PyDict_GET_SIZE(live) != n) return 0;
        if (c->nobjects - c->object < n) return 0;
        /* First in step with the dict's own order (its entries are read in turn, no key is
         * hashed): the common case, a dict that was neither rebuilt nor reordered. */
        Cursor saved = *c;
        Py_ssize_t pos = 0, i;
        PyObject *key, *item;
        for (i = 0; i < n; i++) {
            if (!PyDict_Next(live, &pos, &key, &item)) return 0;
            if (!same_text(c->objects[c->object], key)) break;
            c->object++;
            if (!walk(c, item)) return 0;
        }
        if (i == n) return 1;
        /* Another order: look each recorded key up, as dict == does.  Every live key must be
         * an exact str first, so that the lookups compare strings only (no Python code). */
        pos = 0;
        while (PyDict_Next(live, &pos, &key, &item))
            if (Py_TYPE(key) != &PyUnicode_Type) return 0;
        *c = saved;
        for (i = 0; i < n; i++) {
            item = PyDict_GetItemWithError(live, c->objects[c->object++]);
            if (item == NULL) {
                PyErr_Clear(); /* cannot happen for exact str keys; "changed" is always safe */
                return 0;
            }
            if (!walk(c, item)) return 0;
        }
        return 1; /* same size, and every recorded key (all distinct) found: the same keys */
    }
    case TAG_LIST:
    case TAG_TUPLE: {
        if (!read_length(c, &n)) return 0;
        if (Py_TYPE(live) != (tag == TAG_LIST ? &PyList_Type : &PyTuple_Type) || Py_SIZE(live) != n) return 0;
        PyObject **items = tag == TAG_LIST ? ((PyListObject *)live)->ob_item : ((PyTupleObject *)live)->ob_item;
        for (Py_ssize_t i = 0; i < n; i++)
            if (!walk(c, items[i])) return 0;
        return 1;
    }
    default:
        return 0;
    }
}

#if USE_VERSIONS
/* 1: `live` is provably what was recorded: every dict in it the very dict recorded at its
 * recorded version, every list and tuple holding the very objects recorded; 0: not provably
 * (the full walk decides).  The containers are checked in pre-order, each after what holds it,
 * so an address is only dereferenced once what holds it was found unchanged (an unchanged
 * dict still holds the objects it held, a list found with the recorded items holds them). */
static int fast(PyObject *const *slot, PyObject *const *end, PyObject *live) {
    if (slot == end || (PyObject *)((uintptr_t)*slot & ~(uintptr_t)SLOT_KIND) != live) return 0;
    while (slot < end) {
        uintptr_t word = (uintptr_t)*slot;
        PyObject *container = (PyObject *)(word & ~(uintptr_t)SLOT_KIND);
        if (end - slot < 2) return 0;
        if ((word & SLOT_KIND) == SLOT_DICT) {
            if (Py_TYPE(container) != &PyDict_Type ||
                ((PyDictObject *)container)->ma_version_tag != (uint64_t)(uintptr_t)slot[1])
                return 0;
            slot += 2;
            continue;
        }
        Py_ssize_t n = (Py_ssize_t)(uintptr_t)slot[1];
        PyTypeObject *type = (word & SLOT_KIND) == SLOT_LIST ? &PyList_Type : &PyTuple_Type;
        if (Py_TYPE(container) != type || Py_SIZE(container) != n || end - (slot + 2) < n) return 0;
        PyObject **items = type == &PyList_Type ? ((PyListObject *)container)->ob_item : ((PyTupleObject *)container)->ob_item;
        if (n && memcmp(items, slot + 2, (size_t)n * sizeof(PyObject *)) != 0) return 0;
        slot += 2 + n;
    }
    return 1;
}
#endif

/* 1: `live` is what `rec` recorded; 0: it is not (or `rec` is not a record). */
static int matches(PyObject *rec, PyObject *live) {
    if (Py_TYPE(rec) != &RecordType) return 0;
    Record *r = (Record *)rec;
    Counts counts;
    const unsigned char *code, *end;
    if (!record_layout(r, &counts, &code, &end)) return 0;
    PyObject *const *objects = ((PyTupleObject *)r->shape)->ob_item + 1;
    Py_ssize_t nobjects = PyTuple_GET_SIZE(r->shape) - 1;
#if USE_VERSIONS
    if (fast(r->slots, r->slots + counts.containers, live)) return 1;
#endif
    Cursor c = {code, end, objects, 0, nobjects, r->slots + counts.containers, 0, counts.leaves};
    /* The depth is bounded by the record's code: the live message is only walked where the
     * record has a container, however deep (or cyclic) the live message is. */
    return walk(&c, live) && c.code == c.end && c.leaf == c.nleaves && c.object == c.nobjects;
}

/* How far ahead first_changed asks the CPU for the next messages and records: a held list is
 * read from memory, not from the cache, and each message costs a few dependent loads. */
#define AHEAD 6

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
    if (start < 0) start = 0;
    /* No Python code runs from here on (see the top of this file): the lists keep their items. */
    Py_ssize_t end = stop;
    if (end > PyList_GET_SIZE(records)) end = PyList_GET_SIZE(records);
    if (end > PyList_GET_SIZE(messages)) end = PyList_GET_SIZE(messages);
    PyObject **recs = ((PyListObject *)records)->ob_item, **live = ((PyListObject *)messages)->ob_item;
    Py_ssize_t i = start;
    for (; i < end; i++) {
        if (i + 2 * AHEAD < end) {
            PREFETCH(recs[i + 2 * AHEAD]);
            PREFETCH(live[i + 2 * AHEAD]);
        }
        if (i + AHEAD < end) {
            /* The record asked for AHEAD items ago has arrived: now the containers it recorded
             * (a tool call's list and dicts), which the check reads from their addresses. */
            PyObject *ahead = recs[i + AHEAD];
            PREFETCH((const char *)ahead + 64);
#if USE_VERSIONS
            Counts counts;
            const unsigned char *code, *stop;
            if (Py_TYPE(ahead) == &RecordType && record_layout((Record *)ahead, &counts, &code, &stop)) {
                PyObject *const *slot = ((Record *)ahead)->slots, *const *stop = slot + counts.containers;
                for (int k = 0; slot < stop && k < 4; k++) {
                    uintptr_t word = (uintptr_t)*slot;
                    PREFETCH(word & ~(uintptr_t)SLOT_KIND);
                    slot += 2 + ((word & SLOT_KIND) == SLOT_DICT ? 0 : (Py_ssize_t)(uintptr_t)slot[1]);
                }
            }
#endif
        }
        if (!matches(recs[i], live[i])) return PyLong_FromSsize_t(i);
    }
    return PyLong_FromSsize_t(i < stop ? i : stop);
}

static PyMethodDef methods[] = {
    {"record", (PyCFunction)(void (*)(void))record, METH_FASTCALL,
     "record(message, max_depth) -> Record | None: what first_changed compares the message with later "
     "(None when the message holds anything but exact JSON-like values, or nests deeper than max_depth)."},
    {"first_changed", (PyCFunction)(void (*)(void))first_changed, METH_FASTCALL,
     "first_changed(records, messages, start, stop) -> int: the first index in start..stop-1 whose "
     "message is not what its record recorded (or whose record is not a record), else stop."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "eventlog._check", NULL, 0, methods};

PyMODINIT_FUNC PyInit__check(void) {
    if (PyType_Ready(&RecordType) < 0) return NULL;
    if (shapes == NULL && (shapes = PyDict_New()) == NULL) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddObjectRef(m, "Record", (PyObject *)&RecordType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
