/* The batch check of a bulk flush, in C: whether every message of a batch is plain JSON-like.
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
 * The test suite fuzzes the two against each other.
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

static PyMethodDef methods[] = {
    {"plain_batch", (PyCFunction)(void (*)(void))plain_batch, METH_FASTCALL,
     "plain_batch(messages, max_depth, ints) -> bool: whether every message is a plain JSON-like dict "
     "without top-level _ keys (see eventlog.codec.plain_batch)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "eventlog._plain", NULL, 0, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__plain(void) { return PyModule_Create(&module); }
