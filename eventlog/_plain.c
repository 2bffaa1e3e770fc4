/* The per-message loops of a bulk flush, in C: the check that every message of a batch is plain
 * JSON-like, and the chain entries of a bulk append.
 *
 * `plain_batch(messages, max_depth, ints)` answers what eventlog.codec's pure-Python
 * `plain_batch` answers, in one walk: True when every message is a dict whose keys are
 * exact `str`s, none of its top-level keys starts with "_", and every value all the way
 * down is an exact `str`, `int`, `bool`, `None`, finite `float`, `list`, `tuple` or
 * `dict` with exact `str` keys, with no container (nor float) at depth `max_depth` or
 * deeper (a message's values are at depth 1).  False only means "not shown here": the
 * caller then inspects each message, which names the problem.  A flush has just encoded
 * the messages with msgspec, which proves every int fits in 64 bits; with `ints` true
 * (messages read from JSON, not encoded yet) the walk checks that too.  No Python code
 * runs during the walk: only exact built-in types are entered.
 *
 * `chain_entries(prefix, base, nodes, digests, seq)` builds the index entries of a bulk append
 * as eventlog.keys.chain_entries_python does: for message i, the key `prefix` + big-endian
 * u64 `base + i` and the value node (32) + digest (32) + big-endian u64 `seq` + u32 `i`.
 *
 * The test suite fuzzes each against its pure-Python counterpart.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>

typedef struct {
    int max_depth;
    int ints; /* check that every int fits in 64 bits (signed, or unsigned when positive) */
} Walk;

static int plain_value(PyObject *value, int depth, const Walk *walk);

static int plain_items(PyObject *dict, int depth, const Walk *walk) {
    Py_ssize_t pos = 0;
    PyObject *key, *value;
    while (PyDict_Next(dict, &pos, &key, &value)) {
        if (!PyUnicode_CheckExact(key) || !plain_value(value, depth, walk)) return 0;
    }
    return 1;
}

static int fits_64_bits(PyObject *value) {
    int overflow;
    PyLong_AsLongLongAndOverflow(value, &overflow);
    if (overflow == 0) return 1;
    if (overflow < 0) return 0;
    PyLong_AsUnsignedLongLong(value);
    if (PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    return 1;
}

static int plain_value(PyObject *value, int depth, const Walk *walk) {
    PyTypeObject *type = Py_TYPE(value);
    if (type == &PyUnicode_Type || value == Py_None || type == &PyBool_Type) return 1;
    if (type == &PyLong_Type) return !walk->ints || fits_64_bits(value);
    if (depth >= walk->max_depth) return 0;
    if (type == &PyFloat_Type) return isfinite(PyFloat_AS_DOUBLE(value)) ? 1 : 0;
    if (type == &PyDict_Type) return plain_items(value, depth + 1, walk);
    if (type == &PyList_Type) {
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(value); i++) {
            if (!plain_value(PyList_GET_ITEM(value, i), depth + 1, walk)) return 0;
        }
        return 1;
    }
    if (type == &PyTuple_Type) {
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(value); i++) {
            if (!plain_value(PyTuple_GET_ITEM(value, i), depth + 1, walk)) return 0;
        }
        return 1;
    }
    return 0;
}

static PyObject *plain_batch(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 3 || !PyList_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "plain_batch(messages: list, max_depth: int, ints: bool)");
        return NULL;
    }
    long max_depth = PyLong_AsLong(args[1]);
    if (max_depth == -1 && PyErr_Occurred()) return NULL;
    if (max_depth < 1 || max_depth > 1000) {
        PyErr_SetString(PyExc_ValueError, "max_depth must be between 1 and 1000");
        return NULL;
    }
    int ints = PyObject_IsTrue(args[2]);
    if (ints < 0) return NULL;
    Walk walk = {(int)max_depth, ints};
    PyObject *messages = args[0];
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(messages); i++) {
        PyObject *message = PyList_GET_ITEM(messages, i);
        if (!PyDict_CheckExact(message)) Py_RETURN_FALSE;
        Py_ssize_t pos = 0;
        PyObject *key, *value;
        while (PyDict_Next(message, &pos, &key, &value)) {
            if (!PyUnicode_CheckExact(key)) Py_RETURN_FALSE;
#if PY_VERSION_HEX < 0x030C0000
            if (PyUnicode_READY(key) < 0) return NULL; /* a legacy string: its characters first */
#endif
            if (PyUnicode_GET_LENGTH(key) > 0 && PyUnicode_READ_CHAR(key, 0) == '_') Py_RETURN_FALSE;
            if (!plain_value(value, 1, &walk)) Py_RETURN_FALSE;
        }
    }
    Py_RETURN_TRUE;
}

static void put_be(unsigned char *out, unsigned long long value, int bytes) {
    for (int i = bytes - 1; i >= 0; i--) {
        out[i] = (unsigned char)(value & 0xff);
        value >>= 8;
    }
}

static PyObject *chain_entries(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 5 || !PyBytes_Check(args[0]) || !PyList_Check(args[2]) || !PyList_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError, "chain_entries(prefix: bytes, base: int, nodes: list, digests: list, seq: int)");
        return NULL;
    }
    unsigned long long base = PyLong_AsUnsignedLongLong(args[1]);
    if (base == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    unsigned long long seq = PyLong_AsUnsignedLongLong(args[4]);
    if (seq == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    PyObject *nodes = args[2], *digests = args[3];
    Py_ssize_t count = PyList_GET_SIZE(nodes);
    if (PyList_GET_SIZE(digests) != count) {
        PyErr_SetString(PyExc_ValueError, "chain_entries: as many nodes as digests");
        return NULL;
    }
    if ((unsigned long long)count > 0xffffffffULL || base > 0xffffffffffffffffULL - (unsigned long long)count) {
        PyErr_SetString(PyExc_OverflowError, "chain_entries: positions or indexes out of range");
        return NULL;
    }
    const char *prefix = PyBytes_AS_STRING(args[0]);
    Py_ssize_t prefix_size = PyBytes_GET_SIZE(args[0]);
    PyObject *out = PyList_New(count);
    if (out == NULL) return NULL;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *node = PyList_GET_ITEM(nodes, i), *digest = PyList_GET_ITEM(digests, i);
        if (!PyBytes_Check(node) || PyBytes_GET_SIZE(node) != 32 || !PyBytes_Check(digest) ||
            PyBytes_GET_SIZE(digest) != 32) {
            Py_DECREF(out);
            PyErr_SetString(PyExc_ValueError, "chain_entries: every node and digest is 32 bytes");
            return NULL;
        }
        PyObject *key = PyBytes_FromStringAndSize(NULL, prefix_size + 8);
        PyObject *value = PyBytes_FromStringAndSize(NULL, 76);
        PyObject *pair = PyTuple_New(2);
        if (key == NULL || value == NULL || pair == NULL) {
            Py_XDECREF(key);
            Py_XDECREF(value);
            Py_XDECREF(pair);
            Py_DECREF(out);
            return NULL;
        }
        unsigned char *k = (unsigned char *)PyBytes_AS_STRING(key), *v = (unsigned char *)PyBytes_AS_STRING(value);
        memcpy(k, prefix, (size_t)prefix_size);
        put_be(k + prefix_size, base + (unsigned long long)i, 8);
        memcpy(v, PyBytes_AS_STRING(node), 32);
        memcpy(v + 32, PyBytes_AS_STRING(digest), 32);
        put_be(v + 64, seq, 8);
        put_be(v + 72, (unsigned long long)i, 4);
        PyTuple_SET_ITEM(pair, 0, key);
        PyTuple_SET_ITEM(pair, 1, value);
        PyList_SET_ITEM(out, i, pair);
    }
    return out;
}

static PyMethodDef methods[] = {
    {"plain_batch", (PyCFunction)(void (*)(void))plain_batch, METH_FASTCALL,
     "plain_batch(messages, max_depth, ints) -> bool: whether every message is a plain JSON-like dict "
     "without top-level _ keys (see eventlog.codec.plain_batch)"},
    {"chain_entries", (PyCFunction)(void (*)(void))chain_entries, METH_FASTCALL,
     "chain_entries(prefix, base, nodes, digests, seq) -> list of (key, value): the index entries of a bulk "
     "append (see eventlog.keys.chain_entries)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "eventlog._plain", NULL, 0, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__plain(void) { return PyModule_Create(&module); }
