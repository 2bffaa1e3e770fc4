/* The per-row loop of a SQLite projection's insert, in C.
 *
 * `group_rows(rows, first_id, width, blobs)` answers what projections.sqlite_store's
 * pure-Python `group_rows_python` answers: the rows grouped by their shape, the set of
 * columns that are None, ready for one `executemany` a shape.  Row i (a tuple of `width`
 * values) gets the id `first_id + i`; its group's key has bit j set when its column j is
 * None; its entry is the tuple of that id followed by its columns that are not None, in
 * order, where a column whose bit is set in `blobs` becomes `bytearray(value)` (which the
 * sqlite3 module binds as a BLOB without looking for an adapter, as it must for `bytes`).
 * Groups come in the order their first rows come.  For the values a projection hands it (its
 * blobs are bytes), no Python code runs during the loop.
 *
 * The test suite fuzzes it against its pure-Python counterpart.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#define MAX_WIDTH 63

static PyObject *entry(PyObject *row, Py_ssize_t width, unsigned long long mask, unsigned long long blobs,
                       PyObject *row_id) {
    Py_ssize_t filled = width;
    for (Py_ssize_t j = 0; j < width; j++) {
        if (mask >> j & 1ULL) filled--;
    }
    PyObject *out = PyTuple_New(filled + 1);
    if (out == NULL) return NULL;
    Py_INCREF(row_id);
    PyTuple_SET_ITEM(out, 0, row_id);
    Py_ssize_t at = 1;
    for (Py_ssize_t j = 0; j < width; j++) {
        if (mask >> j & 1ULL) continue;
        PyObject *value = PyTuple_GET_ITEM(row, j);
        if (blobs >> j & 1ULL) {
            value = PyByteArray_FromObject(value);
            if (value == NULL) {
                Py_DECREF(out);
                return NULL;
            }
        } else {
            Py_INCREF(value);
        }
        PyTuple_SET_ITEM(out, at++, value);
    }
    return out;
}

static PyObject *group_rows(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 4 || !PyList_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "group_rows(rows: list, first_id: int, width: int, blobs: int)");
        return NULL;
    }
    PyObject *rows = args[0], *first_id = args[1];
    if (!PyLong_Check(first_id)) {
        PyErr_SetString(PyExc_TypeError, "group_rows: first_id must be an int");
        return NULL;
    }
    Py_ssize_t width = PyLong_AsSsize_t(args[2]);
    if (width == -1 && PyErr_Occurred()) return NULL;
    if (width < 0 || width > MAX_WIDTH) {
        PyErr_Format(PyExc_ValueError, "group_rows: width must be between 0 and %d", MAX_WIDTH);
        return NULL;
    }
    unsigned long long blobs = PyLong_AsUnsignedLongLong(args[3]);
    if (blobs == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    PyObject *groups = PyDict_New();
    if (groups == NULL) return NULL;
    PyObject *row_id = first_id;
    Py_INCREF(row_id);
    PyObject *one = PyLong_FromLong(1);
    if (one == NULL) goto fail;
    /* The list may not change size under the loop: no Python code runs in it. */
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(rows); i++) {
        PyObject *row = PyList_GET_ITEM(rows, i);
        if (!PyTuple_Check(row) || PyTuple_GET_SIZE(row) != width) {
            PyErr_Format(PyExc_ValueError, "group_rows: row %zd is not a tuple of %zd values", i, width);
            goto fail;
        }
        Py_INCREF(row); /* held while a value's buffer is read (code that could drop it from the list) */
        unsigned long long mask = 0;
        for (Py_ssize_t j = 0; j < width; j++) {
            if (PyTuple_GET_ITEM(row, j) == Py_None) mask |= 1ULL << j;
        }
        PyObject *item = entry(row, width, mask, blobs, row_id);
        Py_DECREF(row);
        if (item == NULL) goto fail;
        PyObject *key = PyLong_FromUnsignedLongLong(mask);
        if (key == NULL) {
            Py_DECREF(item);
            goto fail;
        }
        PyObject *group = PyDict_GetItemWithError(groups, key); /* borrowed */
        if (group == NULL) {
            if (PyErr_Occurred() || (group = PyList_New(0)) == NULL) {
                Py_DECREF(key);
                Py_DECREF(item);
                goto fail;
            }
            int stored = PyDict_SetItem(groups, key, group);
            Py_DECREF(group); /* the dict holds it, or it is gone */
            if (stored < 0) {
                Py_DECREF(key);
                Py_DECREF(item);
                goto fail;
            }
        }
        Py_DECREF(key);
        int failed = PyList_Append(group, item);
        Py_DECREF(item);
        if (failed < 0) goto fail;
        PyObject *next = PyNumber_Add(row_id, one);
        if (next == NULL) goto fail;
        Py_SETREF(row_id, next);
    }
    Py_DECREF(one);
    Py_DECREF(row_id);
    return groups;
fail:
    Py_XDECREF(one);
    Py_DECREF(row_id);
    Py_DECREF(groups);
    return NULL;
}

static PyMethodDef methods[] = {
    {"group_rows", (PyCFunction)(void (*)(void))group_rows, METH_FASTCALL,
     "group_rows(rows, first_id, width, blobs) -> dict of shape -> entries: rows grouped for executemany "
     "(see projections.sqlite_store.group_rows)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "projections._rows", NULL, 0, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__rows(void) { return PyModule_Create(&module); }
