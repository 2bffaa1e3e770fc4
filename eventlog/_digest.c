/* The SHA-256 of a large buffer on a native thread, while the caller goes on holding the GIL.
 *
 * `start(prefix, data)` hashes `prefix` at once and hands `data` to the process's worker
 * thread; `Job.finish()` returns SHA-256(prefix || data).  The worker is a bare POSIX thread
 * that never touches a Python object nor the GIL: it reads the buffer the job holds an
 * export of (a bytearray cannot be resized meanwhile) and hashes it with OpenSSL, the
 * library `hashlib` uses.  A job the worker has not taken yet when `finish()` is called
 * (the worker is busy, or not scheduled on a loaded machine) is taken back and hashed by
 * the caller, so the caller never waits for the worker to wake up.  `finish()` releases
 * the GIL while it hashes or waits.  A job dropped without `finish()` waits for the worker
 * in its deallocation before it lets go of the buffer.
 *
 * `each(bodies, offload)` is the same for a batch: the SHA-256 of each `bytes` of a list (a
 * bulk flush's message bodies, a part at a time), hashed by the worker while the caller encodes
 * the next part; `Each.finish()` returns the digests as a list.  `chain(parent, digests)` links
 * digests into node digests (SHA-256 of the parent node and the digest) on the caller's
 * thread.  Both hash with one reused context and the digest fetched once, rather than an
 * object per hash as `hashlib` makes.
 *
 * After fork() the child has no worker: it starts one on its first job.  The test suite
 * checks the digests against hashlib.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <string.h>
#include <unistd.h>

enum { QUEUED, TAKEN, DONE, CALLER, FINISHED };

typedef struct Job {
    PyObject_HEAD
    Py_buffer view;
    EVP_MD_CTX *ctx;
    int state; /* guarded by `lock` while the job is queued or taken */
    int ok;
    unsigned char digest[32];
    struct Job *next;
    PyObject *items;    /* an Each: the tuple of bytes to hash one by one (NULL for a Job) */
    unsigned char *out; /* an Each: 32 bytes per item */
} Job;

static PyTypeObject EachType;
static const EVP_MD *sha256_md = NULL; /* fetched once (OpenSSL 3 would fetch it at every init) */

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t work_ready = PTHREAD_COND_INITIALIZER;
static pthread_cond_t work_done = PTHREAD_COND_INITIALIZER;
static Job *head = NULL, *tail = NULL;
static Job *current = NULL; /* the job the worker is hashing */
static pid_t worker_pid = 0; /* the process whose worker runs (0: none) */

/* Each item's SHA-256 into `out`.  Runs without the GIL: the items are bytes objects, which
 * never change, kept alive by the tuple the job holds. */
static int hash_each(EVP_MD_CTX *ctx, PyObject *items, unsigned char *out) {
    Py_ssize_t n = PyTuple_GET_SIZE(items);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyTuple_GET_ITEM(items, i);
        if (EVP_DigestInit_ex(ctx, sha256_md, NULL) != 1 ||
            EVP_DigestUpdate(ctx, PyBytes_AS_STRING(item), (size_t)PyBytes_GET_SIZE(item)) != 1 ||
            EVP_DigestFinal_ex(ctx, out + 32 * i, NULL) != 1)
            return 0;
    }
    return 1;
}

static int hash_rest(Job *job) {
    if (job->items != NULL) return hash_each(job->ctx, job->items, job->out);
    return EVP_DigestUpdate(job->ctx, job->view.buf, (size_t)job->view.len) == 1 &&
           EVP_DigestFinal_ex(job->ctx, job->digest, NULL) == 1;
}

static void *serve(void *unused) {
    (void)unused;
    pthread_mutex_lock(&lock);
    for (;;) {
        while (head == NULL) pthread_cond_wait(&work_ready, &lock);
        Job *job = head;
        head = job->next;
        if (head == NULL) tail = NULL;
        job->next = NULL;
        job->state = TAKEN;
        current = job;
        pthread_mutex_unlock(&lock);
        int ok = hash_rest(job);
        pthread_mutex_lock(&lock);
        current = NULL;
        job->ok = ok;
        job->state = DONE;
        pthread_cond_broadcast(&work_done);
    }
    return NULL;
}

/* Called with `lock` held: whether this process has its worker (started now if need be). */
static int have_worker(void) {
    pid_t pid = getpid();
    if (worker_pid == pid) return 1;
    pthread_t thread;
    pthread_attr_t attr;
    if (pthread_attr_init(&attr) != 0) return 0;
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int started = pthread_create(&thread, &attr, serve, NULL) == 0;
    pthread_attr_destroy(&attr);
    if (started) worker_pid = pid;
    return started;
}

static void before_fork(void) { pthread_mutex_lock(&lock); }

static void after_fork_in_parent(void) { pthread_mutex_unlock(&lock); }

static void after_fork_in_child(void) {
    /* Only the forking thread exists here, and no worker: queued jobs are dropped (their
     * threads are gone too), and a job the parent's worker was hashing fails rather than
     * waiting for a thread that does not exist. */
    if (current != NULL) {
        current->ok = 0;
        current->state = DONE;
        current = NULL;
    }
    head = tail = NULL;
    worker_pid = 0;
    pthread_cond_init(&work_ready, NULL);
    pthread_cond_init(&work_done, NULL);
    pthread_mutex_unlock(&lock); /* taken by this thread before the fork */
}

/* Take the job back if it is still queued; else wait for the worker to be done with it. */
static void settle(Job *job) {
    pthread_mutex_lock(&lock);
    if (job->state == QUEUED) {
        Job **link = &head, *previous = NULL;
        while (*link != NULL && *link != job) {
            previous = *link;
            link = &(*link)->next;
        }
        if (*link == job) {
            *link = job->next;
            if (tail == job) tail = previous;
        }
        job->next = NULL;
        job->state = CALLER;
    }
    while (job->state == TAKEN) pthread_cond_wait(&work_done, &lock);
    pthread_mutex_unlock(&lock);
}

/* What a job holds until it is finished: its buffer or items, its context, its output. */
static void job_release(Job *job) {
    if (Py_IS_TYPE(job, &EachType)) {
        Py_CLEAR(job->items);
        PyMem_Free(job->out);
        job->out = NULL;
    } else {
        PyBuffer_Release(&job->view);
    }
    EVP_MD_CTX_free(job->ctx);
    job->ctx = NULL;
}

/* Wait for the worker, or hash here; 0 (an exception set) when the job cannot finish. */
static int job_settle(Job *job) {
    if (job->state == FINISHED) {
        PyErr_SetString(PyExc_RuntimeError, "the job is finished already");
        return 0;
    }
    int ok;
    Py_BEGIN_ALLOW_THREADS
    settle(job);
    if (job->state == CALLER) job->ok = hash_rest(job);
    ok = job->ok;
    Py_END_ALLOW_THREADS
    job->state = FINISHED;
    if (!ok) {
        job_release(job);
        PyErr_SetString(PyExc_RuntimeError, "OpenSSL could not compute the SHA-256");
        return 0;
    }
    return 1;
}

static PyObject *job_finish(Job *job, PyObject *unused) {
    (void)unused;
    if (!job_settle(job)) return NULL;
    job_release(job);
    return PyBytes_FromStringAndSize((const char *)job->digest, 32);
}

static PyObject *each_finish(Job *job, PyObject *unused) {
    (void)unused;
    if (!job_settle(job)) return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(job->items);
    PyObject *digests = PyList_New(n);
    for (Py_ssize_t i = 0; digests != NULL && i < n; i++) {
        PyObject *digest = PyBytes_FromStringAndSize((const char *)job->out + 32 * i, 32);
        if (digest == NULL) Py_CLEAR(digests);
        else PyList_SET_ITEM(digests, i, digest);
    }
    job_release(job);
    return digests;
}

static void job_dealloc(Job *job) {
    if (job->state != FINISHED) {
        Py_BEGIN_ALLOW_THREADS
        settle(job);
        Py_END_ALLOW_THREADS
        job_release(job);
    }
    PyObject_Free(job);
}

static PyMethodDef job_methods[] = {
    {"finish", (PyCFunction)job_finish, METH_NOARGS,
     "finish() -> bytes: SHA-256(prefix || data), waiting for the worker or hashing here; once only"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject JobType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "eventlog._digest.Job",
    .tp_basicsize = sizeof(Job),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A SHA-256 being computed on the worker thread (see start()).",
    .tp_dealloc = (destructor)job_dealloc,
    .tp_methods = job_methods,
};

static PyMethodDef each_methods[] = {
    {"finish", (PyCFunction)each_finish, METH_NOARGS,
     "finish() -> list[bytes]: the SHA-256 of each item, waiting for the worker or hashing here; once only"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject EachType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "eventlog._digest.Each",
    .tp_basicsize = sizeof(Job),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The SHA-256 of each of a list of bytes, being computed on the worker thread (see each()).",
    .tp_dealloc = (destructor)job_dealloc,
    .tp_methods = each_methods,
};

/* Called with `lock` held: queue `job` for the worker, if this process has one. */
static void enqueue(Job *job) {
    if (have_worker()) {
        job->state = QUEUED;
        if (tail == NULL) head = job;
        else tail->next = job;
        tail = job;
        pthread_cond_signal(&work_ready);
    }
}

static PyObject *start(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "start(prefix, data, offload: bool)");
        return NULL;
    }
    int offload = PyObject_IsTrue(args[2]);
    if (offload < 0) return NULL;
    Py_buffer prefix;
    if (PyObject_GetBuffer(args[0], &prefix, PyBUF_SIMPLE) < 0) return NULL;
    Job *job = PyObject_New(Job, &JobType);
    if (job == NULL) {
        PyBuffer_Release(&prefix);
        return NULL;
    }
    job->ctx = NULL;
    job->next = NULL;
    job->items = NULL;
    job->out = NULL;
    job->ok = 0;
    job->state = FINISHED; /* nothing to release until the buffer is held */
    if (PyObject_GetBuffer(args[1], &job->view, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&prefix);
        Py_DECREF(job);
        return NULL;
    }
    job->ctx = EVP_MD_CTX_new();
    int ok = job->ctx != NULL && EVP_DigestInit_ex(job->ctx, sha256_md, NULL) == 1 &&
             EVP_DigestUpdate(job->ctx, prefix.buf, (size_t)prefix.len) == 1;
    PyBuffer_Release(&prefix);
    job->state = CALLER;
    if (!ok) {
        Py_DECREF(job);
        PyErr_SetString(PyExc_RuntimeError, "OpenSSL could not start a SHA-256");
        return NULL;
    }
    if (offload) {
        pthread_mutex_lock(&lock);
        enqueue(job);
        pthread_mutex_unlock(&lock);
    }
    return (PyObject *)job;
}

static PyObject *each(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "each(items: list[bytes], offload: bool)");
        return NULL;
    }
    int offload = PyObject_IsTrue(args[1]);
    if (offload < 0) return NULL;
    PyObject *items = PySequence_Tuple(args[0]); /* the job's own: the caller's list may change */
    if (items == NULL) return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(items);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!PyBytes_CheckExact(PyTuple_GET_ITEM(items, i))) {
            PyErr_Format(PyExc_TypeError, "each(): item %zd is %.100s, not bytes", i,
                         Py_TYPE(PyTuple_GET_ITEM(items, i))->tp_name);
            Py_DECREF(items);
            return NULL;
        }
    }
    Job *job = PyObject_New(Job, &EachType);
    if (job == NULL) {
        Py_DECREF(items);
        return NULL;
    }
    job->next = NULL;
    job->ok = 0;
    job->items = items;
    job->out = PyMem_Malloc(n > 0 ? (size_t)(32 * n) : 1);
    job->ctx = EVP_MD_CTX_new();
    job->state = CALLER;
    if (job->out == NULL || job->ctx == NULL) {
        Py_DECREF(job); /* CALLER: its deallocation lets go of what it holds */
        return PyErr_NoMemory();
    }
    if (offload && n > 0) {
        pthread_mutex_lock(&lock);
        enqueue(job);
        pthread_mutex_unlock(&lock);
    }
    return (PyObject *)job;
}

static PyObject *chain(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 2 || !PyBytes_CheckExact(args[0]) || PyBytes_GET_SIZE(args[0]) != 32 || !PyList_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "chain(parent: 32 bytes, digests: list[bytes of 32])");
        return NULL;
    }
    PyObject *digests = args[1];
    Py_ssize_t n = PyList_GET_SIZE(digests);
    unsigned char link[64];
    memcpy(link, PyBytes_AS_STRING(args[0]), 32);
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    PyObject *nodes = ctx == NULL ? PyErr_NoMemory() : PyList_New(n);
    for (Py_ssize_t i = 0; nodes != NULL && i < n; i++) {
        PyObject *digest = PyList_GET_ITEM(digests, i);
        if (!PyBytes_CheckExact(digest) || PyBytes_GET_SIZE(digest) != 32) {
            PyErr_Format(PyExc_TypeError, "chain(): digest %zd is not 32 bytes", i);
            Py_CLEAR(nodes);
            break;
        }
        memcpy(link + 32, PyBytes_AS_STRING(digest), 32);
        if (EVP_DigestInit_ex(ctx, sha256_md, NULL) != 1 || EVP_DigestUpdate(ctx, link, 64) != 1 ||
            EVP_DigestFinal_ex(ctx, link, NULL) != 1) {
            PyErr_SetString(PyExc_RuntimeError, "OpenSSL could not compute the SHA-256");
            Py_CLEAR(nodes);
            break;
        }
        PyObject *node = PyBytes_FromStringAndSize((const char *)link, 32);
        if (node == NULL) Py_CLEAR(nodes);
        else PyList_SET_ITEM(nodes, i, node);
    }
    EVP_MD_CTX_free(ctx);
    return nodes;
}

static PyMethodDef methods[] = {
    {"start", (PyCFunction)(void (*)(void))start, METH_FASTCALL,
     "start(prefix, data, offload) -> Job: SHA-256(prefix || data), data hashed on the worker thread when "
     "offload is true (see eventlog.overlap); data must not change until Job.finish()"},
    {"each", (PyCFunction)(void (*)(void))each, METH_FASTCALL,
     "each(items, offload) -> Each: the SHA-256 of each bytes of items, hashed on the worker thread when "
     "offload is true"},
    {"chain", (PyCFunction)(void (*)(void))chain, METH_FASTCALL,
     "chain(parent, digests) -> list[bytes]: each digest's node, SHA-256(previous node || digest), from parent"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "eventlog._digest", NULL, 0, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__digest(void) {
    if (PyType_Ready(&JobType) < 0 || PyType_Ready(&EachType) < 0) return NULL;
    if (sha256_md == NULL) {
#if OPENSSL_VERSION_NUMBER >= 0x30000000L
        sha256_md = EVP_MD_fetch(NULL, "SHA256", NULL);
#endif
        if (sha256_md == NULL) sha256_md = EVP_sha256();
    }
    static int registered = 0;
    if (!registered) {
        if (pthread_atfork(before_fork, after_fork_in_parent, after_fork_in_child) != 0) {
            PyErr_SetString(PyExc_ImportError, "eventlog._digest: pthread_atfork failed");
            return NULL;
        }
        registered = 1;
    }
    return PyModule_Create(&module);
}
