/* The per-row loops of a projection, in C: a row's derived columns, and the shaping of rows for
 * a SQLite insert.
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
 * `derive(message, encode, text_of)` answers what projections.rows' `derive_python(message,
 * None)` answers for a message displayed without an override: the derived columns of its row,
 * with JSON text from msgspec's `encode` (as rows.to_json) and the text of content that is not
 * a str from `text_of` (eventlog.text's).  It returns None, and the caller derives in Python,
 * when the message is not an exact dict, one of its values is not of an exact JSON type, or a
 * content part's type is neither.
 *
 * The test suite fuzzes each against its pure-Python counterpart.
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
    if (!PyLong_CheckExact(first_id)) {
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
    /* The size is read again for each row: bytearray() of an odd blob could run code that changes the list. */
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(rows); i++) {
        PyObject *row = PyList_GET_ITEM(rows, i);
        if (!PyTuple_CheckExact(row) || PyTuple_GET_SIZE(row) != width) {
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

/* The derived columns, in projections.rows.DERIVED order. */
enum {
    ROLE, CONTENT, API_CONTENT, TOOL_CALLS, TOOL_CALL_ID, TOOL_NAME, NAME, FINISH_REASON, REASONING,
    REASONING_CONTENT, REASONING_DETAILS, TIMESTAMP, DISPLAY_KIND, DISPLAY_METADATA, DISPLAY_OVERRIDE,
    PLATFORM_MESSAGE_ID, TOOL_TEXT, MESSAGE, DERIVED_COUNT
};

static int json_type(PyObject *value) {
    PyTypeObject *type = Py_TYPE(value);
    return type == &PyUnicode_Type || value == Py_None || type == &PyLong_Type || type == &PyFloat_Type ||
           type == &PyBool_Type || type == &PyList_Type || type == &PyDict_Type;
}

/* The keys derive looks up, interned once (a lookup then reuses their hash). */
enum {
    K_CONTENT, K_ROLE, K_TYPE, K_OUTPUT, K_NAME, K_TOOL_NAME, K_TOOL_CALL_ID, K_CALL_ID, K_TOOL_CALLS,
    K_FINISH_REASON, K_REASONING, K_REASONING_CONTENT, K_REASONING_DETAILS, K_TIMESTAMP, K_DISPLAY_KIND,
    K_DISPLAY_METADATA, K_PLATFORM_MESSAGE_ID, K_FUNCTION, K_ARGUMENTS, K_INPUT, KEY_COUNT
};
static const char *key_names[KEY_COUNT] = {
    "content", "role", "type", "output", "name", "tool_name", "tool_call_id", "call_id", "tool_calls",
    "finish_reason", "reasoning", "reasoning_content", "reasoning_details", "timestamp", "display_kind",
    "display_metadata", "platform_message_id", "function", "arguments", "input",
};
static PyObject *keys[KEY_COUNT];

/* `message.get(key)`, borrowed; NULL when absent, or with an error set where one of the dict's keys
 * is not a str and raises when compared (the message's own keys are all str: checked first). */
static PyObject *get(PyObject *message, int key) { return PyDict_GetItemWithError(message, keys[key]); }

/* JSON text of a value, as rows.to_json gives it: msgspec's encoding (`encode`), decoded. */
static PyObject *json_text(PyObject *value, PyObject *encode) {
    PyObject *encoded = PyObject_CallOneArg(encode, value);
    if (encoded == NULL) return NULL;
    if (!PyBytes_Check(encoded)) {
        Py_DECREF(encoded);
        PyErr_SetString(PyExc_TypeError, "derive: encode must return bytes");
        return NULL;
    }
    PyObject *text = PyUnicode_DecodeUTF8(PyBytes_AS_STRING(encoded), PyBytes_GET_SIZE(encoded), NULL);
    Py_DECREF(encoded);
    return text;
}

/* text_or_json: None stays None, a str is kept, anything else becomes JSON text. */
static PyObject *text_or_json(PyObject *value, PyObject *encode) {
    if (value == NULL || value == Py_None) Py_RETURN_NONE;
    if (PyUnicode_CheckExact(value)) return Py_NewRef(value);
    return json_text(value, encode);
}

/* scalar: what SQLite stores as it is; an int past 64 bits as its decimal text, a bool as 0 or 1. */
static PyObject *scalar(PyObject *value, PyObject *encode) {
    if (value == NULL || value == Py_None) Py_RETURN_NONE;
    if (PyUnicode_CheckExact(value) || PyFloat_CheckExact(value)) return Py_NewRef(value);
    if (PyLong_CheckExact(value)) {
        int overflow;
        long long number = PyLong_AsLongLongAndOverflow(value, &overflow);
        if (number == -1 && PyErr_Occurred()) return NULL;
        return overflow ? PyObject_Str(value) : Py_NewRef(value);
    }
    if (PyBool_Check(value)) return PyLong_FromLong(value == Py_True);
    return json_text(value, encode);
}

/* A str, or a value of a JSON type (which no str equals); else the caller leaves it to Python. */
enum { OTHER = -1, UNEQUAL = 0, EQUAL = 1 };
static int equals(PyObject *value, const char *text) {
    if (value == NULL) return UNEQUAL;
    if (PyUnicode_CheckExact(value)) return PyUnicode_CompareWithASCIIString(value, text) == 0 ? EQUAL : UNEQUAL;
    return json_type(value) ? UNEQUAL : OTHER;
}

/* rows._call_words: a call's name and arguments (as text), appended to `words`; -1 on error. */
static int call_words(PyObject *call, PyObject *words, PyObject *encode) {
    PyObject *name = get(call, K_NAME);
    if (name == NULL && PyErr_Occurred()) return -1;
    if (name != NULL && PyUnicode_CheckExact(name) && PyList_Append(words, name) < 0) return -1;
    PyObject *arguments = get(call, K_ARGUMENTS);
    if (arguments == NULL) {
        if (PyErr_Occurred()) return -1;
        arguments = get(call, K_INPUT);
        if (arguments == NULL && PyErr_Occurred()) return -1;
    }
    if (arguments == NULL || arguments == Py_None) return 0;
    PyObject *word = text_or_json(arguments, encode);
    if (word == NULL) return -1;
    int failed = PyList_Append(words, word);
    Py_DECREF(word);
    return failed;
}

/* rows.tool_text: tool names and call arguments, for the search index.  Sets *other (and
 * returns NULL with no error) where a part's type is neither a str nor of a JSON type. */
static PyObject *tool_text(PyObject *message, PyObject *tool_name, PyObject *encode, int *other) {
    PyObject *words = PyList_New(0);
    if (words == NULL) return NULL;
    if (tool_name != NULL && PyUnicode_CheckExact(tool_name) && PyUnicode_GET_LENGTH(tool_name) > 0 &&
        PyList_Append(words, tool_name) < 0)
        goto fail;
    PyObject *calls = get(message, K_TOOL_CALLS);
    if (calls != NULL && PyList_CheckExact(calls)) {
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(calls); i++) {
            PyObject *call = PyList_GET_ITEM(calls, i);
            if (!PyDict_CheckExact(call)) continue;
            PyObject *function = get(call, K_FUNCTION);
            if (function == NULL && PyErr_Occurred()) goto fail;
            if (call_words(function != NULL && PyDict_CheckExact(function) ? function : call, words, encode) < 0)
                goto fail;
        }
    }
    if (equals(get(message, K_TYPE), "function_call") == EQUAL && call_words(message, words, encode) < 0) goto fail;
    PyObject *content = get(message, K_CONTENT);
    if (content != NULL && PyList_CheckExact(content)) {
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(content); i++) {
            PyObject *part = PyList_GET_ITEM(content, i);
            if (!PyDict_CheckExact(part)) continue;
            PyObject *kind = get(part, K_TYPE);
            if (kind == NULL && PyErr_Occurred()) goto fail;
            int use = equals(kind, "tool_use"), server = equals(kind, "server_tool_use");
            if (use == OTHER) {
                *other = 1;
                goto fail;
            }
            if ((use == EQUAL || server == EQUAL) && call_words(part, words, encode) < 0) goto fail;
        }
    }
    PyObject *text = Py_NewRef(Py_None);
    if (PyList_GET_SIZE(words) > 0) {
        PyObject *space = PyUnicode_FromString(" ");
        Py_DECREF(text);
        text = space == NULL ? NULL : PyUnicode_Join(space, words);
        Py_XDECREF(space);
    }
    Py_DECREF(words);
    return text;
fail:
    Py_DECREF(words);
    return NULL;
}

static PyObject *derive(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "derive(message, encode, text_of)");
        return NULL;
    }
    PyObject *message = args[0], *encode = args[1], *text_of = args[2];
    if (!PyDict_CheckExact(message)) Py_RETURN_NONE;
    Py_ssize_t pos = 0;
    PyObject *key, *value;
    while (PyDict_Next(message, &pos, &key, &value)) {
        if (!PyUnicode_CheckExact(key) || !json_type(value)) Py_RETURN_NONE;
    }
    /* The values looked up are borrowed from `message`: only text_of runs Python code, and it
     * reads what it is given. */
    PyObject *content = get(message, K_CONTENT);
    PyObject *role = get(message, K_ROLE);
    if (role == NULL || role == Py_None) {
        PyObject *kind = get(message, K_TYPE);
        if (kind != NULL && PyUnicode_CheckExact(kind)) role = kind;
    }
    if (content == NULL) { /* no content at all: a Responses API function_call_output's is its output */
        PyObject *output = get(message, K_OUTPUT);
        if (output != NULL) content = output;
    }
    int assistant = equals(role, "assistant") == EQUAL;
    PyObject *name = get(message, K_NAME);
    PyObject *tool_name = get(message, K_TOOL_NAME);
    if ((tool_name == NULL || tool_name == Py_None) &&
        (equals(role, "tool") == EQUAL || equals(role, "function") == EQUAL) && name != NULL &&
        PyUnicode_CheckExact(name))
        tool_name = name;
    PyObject *tool_call_id = get(message, K_TOOL_CALL_ID);
    if (tool_call_id == NULL) tool_call_id = get(message, K_CALL_ID);

    PyObject *out = PyTuple_New(DERIVED_COUNT);
    if (out == NULL) return NULL;
    PyObject *item;
    int other = 0;
#define SET(index, expression)                \
    do {                                      \
        item = (expression);                  \
        if (item == NULL) goto fail;          \
        PyTuple_SET_ITEM(out, (index), item); \
    } while (0)
    SET(ROLE, text_or_json(role, encode));
    if (content == NULL || content == Py_None || PyUnicode_CheckExact(content)) {
        SET(CONTENT, text_or_json(content, encode));
    } else {
        SET(CONTENT, PyObject_CallOneArg(text_of, content));
    }
    SET(API_CONTENT, Py_NewRef(Py_None));
    SET(TOOL_CALLS, text_or_json(get(message, K_TOOL_CALLS), encode));
    SET(TOOL_CALL_ID, text_or_json(tool_call_id, encode));
    SET(TOOL_NAME, text_or_json(tool_name, encode));
    SET(NAME, text_or_json(name, encode));
    SET(FINISH_REASON, text_or_json(get(message, K_FINISH_REASON), encode));
    SET(REASONING, assistant ? text_or_json(get(message, K_REASONING), encode) : Py_NewRef(Py_None));
    SET(REASONING_CONTENT, assistant ? text_or_json(get(message, K_REASONING_CONTENT), encode) : Py_NewRef(Py_None));
    SET(REASONING_DETAILS, assistant ? text_or_json(get(message, K_REASONING_DETAILS), encode) : Py_NewRef(Py_None));
    SET(TIMESTAMP, scalar(get(message, K_TIMESTAMP), encode));
    SET(DISPLAY_KIND, text_or_json(get(message, K_DISPLAY_KIND), encode));
    SET(DISPLAY_METADATA, text_or_json(get(message, K_DISPLAY_METADATA), encode));
    SET(DISPLAY_OVERRIDE, Py_NewRef(Py_None));
    SET(PLATFORM_MESSAGE_ID, scalar(get(message, K_PLATFORM_MESSAGE_ID), encode));
    SET(TOOL_TEXT, tool_text(message, tool_name, encode, &other));
    SET(MESSAGE, json_text(message, encode));
#undef SET
    return out;
fail:
    Py_DECREF(out);
    if (other && !PyErr_Occurred()) Py_RETURN_NONE;
    return NULL;
}

static PyMethodDef methods[] = {
    {"group_rows", (PyCFunction)(void (*)(void))group_rows, METH_FASTCALL,
     "group_rows(rows, first_id, width, blobs) -> dict of shape -> entries: rows grouped for executemany "
     "(see projections.sqlite_store.group_rows)"},
    {"derive", (PyCFunction)(void (*)(void))derive, METH_FASTCALL,
     "derive(message, encode, text_of) -> tuple or None: a row's derived columns for a message "
     "without a display override (see projections.rows.derive)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "projections._rows", NULL, 0, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__rows(void) {
    for (int i = 0; i < KEY_COUNT; i++) {
        if (keys[i] == NULL && (keys[i] = PyUnicode_InternFromString(key_names[i])) == NULL) return NULL;
    }
    return PyModule_Create(&module);
}
