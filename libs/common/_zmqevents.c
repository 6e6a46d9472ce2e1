/* A ZMQ socket's ZMQ_EVENTS as a plain int, for LoopSocket (switchyard.common.messaging).
 *
 * pyzmq's Socket.get looks the option up as a SocketOption enum and its type as another on
 * every call: two Python-level enum calls around one zmq_getsockopt. Here the call goes
 * straight to the zmq_getsockopt of the libzmq pyzmq itself uses (found with dlsym from
 * pyzmq's backend module, which links it; never a second copy of libzmq).
 *
 *   init(backend_path, fallback)  bind to the libzmq that backend_path (pyzmq's compiled
 *                                 backend module, already loaded) links; fallback(sock) is the
 *                                 Python form, called for a closed socket and on any error,
 *                                 so that it raises exactly as pyzmq does
 *   events(sock)                  ZMQ_EVENTS of a pyzmq socket, an int
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <errno.h>
#include <stddef.h>

#define ZMQ_EVENTS 15 /* zmq.h; the parity test checks it against pyzmq's */

typedef int (*getsockopt_fn)(void *socket, int option, void *value, size_t *size);

static getsockopt_fn zmq_getsockopt_ptr = NULL;
static PyObject *fallback = NULL;
static PyObject *str_underlying = NULL;

static PyObject *py_init(PyObject *self, PyObject *args)
{
    const char *path;
    PyObject *python_form;
    if (!PyArg_ParseTuple(args, "sO:init", &path, &python_form))
        return NULL;
    if (!PyCallable_Check(python_form)) {
        PyErr_SetString(PyExc_TypeError, "fallback must be callable");
        return NULL;
    }
    /* RTLD_NOLOAD: the module is loaded already (pyzmq imported it); dlsym on its handle
     * searches it and the libraries it links, libzmq among them. */
    void *handle = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    if (handle == NULL) {
        const char *why = dlerror();
        PyErr_Format(PyExc_OSError, "%s is not loaded: %s", path, why ? why : "?");
        return NULL;
    }
    void *symbol = dlsym(handle, "zmq_getsockopt");
    if (symbol == NULL) {
        dlclose(handle);
        PyErr_Format(PyExc_OSError, "no zmq_getsockopt reachable from %s", path);
        return NULL;
    }
    /* The handle is kept (never dlclose'd): the module stays loaded anyway. */
    zmq_getsockopt_ptr = (getsockopt_fn)symbol;
    Py_INCREF(python_form);
    Py_XSETREF(fallback, python_form);
    Py_RETURN_NONE;
}

static PyObject *py_events(PyObject *self, PyObject *sock)
{
    if (zmq_getsockopt_ptr == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_zmqevents.init() was not called");
        return NULL;
    }
    /* pyzmq sets the handle to NULL when it closes the socket (also from ctx.destroy). */
    PyObject *underlying = PyObject_GetAttr(sock, str_underlying);
    if (underlying == NULL)
        return NULL;
    void *handle = PyLong_AsVoidPtr(underlying);
    Py_DECREF(underlying);
    if (handle == NULL) {
        if (PyErr_Occurred())
            return NULL;
        return PyObject_CallOneArg(fallback, sock); /* closed: it raises ENOTSOCK */
    }
    int value = 0;
    for (;;) {
        size_t size = sizeof(value);
        if (zmq_getsockopt_ptr(handle, ZMQ_EVENTS, &value, &size) == 0)
            return PyLong_FromLong(value);
        if (errno != EINTR) /* pyzmq retries EINTR too */
            return PyObject_CallOneArg(fallback, sock);
    }
}

static PyMethodDef methods[] = {
    {"init", py_init, METH_VARARGS,
     "init(backend_path, fallback): bind to the libzmq of pyzmq's backend module."},
    {"events", py_events, METH_O, "events(sock) -> int: the socket's ZMQ_EVENTS."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_zmqevents",
    "A ZMQ socket's ZMQ_EVENTS without pyzmq's option lookup.", -1, methods,
};

PyMODINIT_FUNC PyInit__zmqevents(void)
{
    str_underlying = PyUnicode_InternFromString("underlying");
    if (str_underlying == NULL)
        return NULL;
    return PyModule_Create(&module);
}
