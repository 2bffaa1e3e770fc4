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
 * After fork() the child has no worker: it starts one on its first job.  The test suite
 * checks the digests against hashlib.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <openssl/evp.h>
#include <pthread.h>
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
} Job;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t work_ready = PTHREAD_COND_INITIALIZER;
static pthread_cond_t work_done = PTHREAD_COND_INITIALIZER;
static Job *head = NULL, *tail = NULL;
static Job *current = NULL; /* the job the worker is hashing */
static pid_t worker_pid = 0; /* the process whose worker runs (0: none) */

static int hash_rest(Job *job) {
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

static PyObject *job_finish(Job *job, PyObject *unused) {
    (void)unused;
    if (job->state == FINISHED) {
        PyErr_SetString(PyExc_RuntimeError, "the job is finished already");
        return NULL;
    }
    int ok;
    Py_BEGIN_ALLOW_THREADS
    settle(job);
    if (job->state == CALLER) job->ok = hash_rest(job);
    ok = job->ok;
    Py_END_ALLOW_THREADS
    job->state = FINISHED;
    PyBuffer_Release(&job->view);
    EVP_MD_CTX_free(job->ctx);
    job->ctx = NULL;
    if (!ok) {
        PyErr_SetString(PyExc_RuntimeError, "OpenSSL could not compute the SHA-256");
        return NULL;
    }
    return PyBytes_FromStringAndSize((const char *)job->digest, 32);
}

static void job_dealloc(Job *job) {
    if (job->state != FINISHED) {
        Py_BEGIN_ALLOW_THREADS
        settle(job);
        Py_END_ALLOW_THREADS
        PyBuffer_Release(&job->view);
        EVP_MD_CTX_free(job->ctx);
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
    job->ok = 0;
    job->state = FINISHED; /* nothing to release until the buffer is held */
    if (PyObject_GetBuffer(args[1], &job->view, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&prefix);
        Py_DECREF(job);
        return NULL;
    }
    job->ctx = EVP_MD_CTX_new();
    int ok = job->ctx != NULL && EVP_DigestInit_ex(job->ctx, EVP_sha256(), NULL) == 1 &&
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
        if (have_worker()) {
            job->state = QUEUED;
            if (tail == NULL) head = job;
            else tail->next = job;
            tail = job;
            pthread_cond_signal(&work_ready);
        }
        pthread_mutex_unlock(&lock);
    }
    return (PyObject *)job;
}

static PyMethodDef methods[] = {
    {"start", (PyCFunction)(void (*)(void))start, METH_FASTCALL,
     "start(prefix, data, offload) -> Job: SHA-256(prefix || data), data hashed on the worker thread when "
     "offload is true (see eventlog.overlap); data must not change until Job.finish()"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "eventlog._digest", NULL, 0, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__digest(void) {
    if (PyType_Ready(&JobType) < 0) return NULL;
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
