/*
 * headrace.broker._scheduling -- the broker's cooperative scheduling hint to the cleaner.
 *
 * Owns note_broker_request(): the event loop calls it on every request it receives, and it
 * stores the CLOCK_MONOTONIC time into the word storage's cleaner spans read
 * (headrace/storage/cooperative_spans.h: a niced span pauses briefly between chunks while
 * requests keep coming). The word belongs to headrace.storage._segment_io, which exports its
 * address as a capsule; this module imports it at init -- the broker depends on storage, never
 * the reverse. The Python face is headrace/broker/scheduling.py.
 *
 * Thread-safety: note_broker_request is one relaxed atomic store; callable from any thread.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include "../storage/cooperative_spans.h"

static int64_t *broker_request_ns; /* storage's word, from its capsule at module init */

static PyObject *py_note_broker_request(PyObject *self, PyObject *unused)
{
    __atomic_store_n(broker_request_ns, monotonic_ns(), __ATOMIC_RELAXED);
    Py_RETURN_NONE;
}

static PyMethodDef scheduling_methods[] = {
    {"note_broker_request", py_note_broker_request, METH_NOARGS,
     "note_broker_request() -> None: the broker received a request now; niced cleaner spans "
     "pause briefly between chunks while requests keep coming (cooperative spans)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef scheduling_module = {
    PyModuleDef_HEAD_INIT, "headrace.broker._scheduling",
    "The broker's scheduling hint to the cleaner; use headrace.broker.scheduling.", -1,
    scheduling_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__scheduling(void)
{
    /* PyCapsule_Import only imports the first package of the name: import the module first. */
    PyObject *storage = PyImport_ImportModule("headrace.storage._segment_io");
    if (storage == NULL)
        return NULL;
    Py_DECREF(storage);
    broker_request_ns = PyCapsule_Import(BROKER_REQUEST_CAPSULE, 0);
    if (broker_request_ns == NULL)
        return NULL;
    return PyModule_Create(&scheduling_module);
}
