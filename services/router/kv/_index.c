/* The KV index's two common per-block dict operations in C (index.py keeps their Python
 * form, `_store_new` and `_remove_plain`, as the fallback and the reference):
 *
 *   store_new(own_of, masks, engine_hashes, owns, bit) -> 0, 1 or 2
 *   remove_plain(own_of, masks, engine_hashes, keep) -> None
 *
 * The same dict operations in the same order as the Python form, without an iterator, a
 * tuple or a bound-method call per block.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* A BlockStored of blocks new to the worker: when no engine hash is in `own_of`, map each
 * to its router hash (else 2, nothing done); then, when no router hash is in `masks`, give
 * each the worker's bit and return 0 (else 1: `masks` untouched, the caller books aliases). */
static int store_new_seq(PyObject *own_of, PyObject *masks, PyObject *engine, PyObject *owns,
                         PyObject *bit)
{
    Py_ssize_t n = PySequence_Fast_GET_SIZE(engine);
    PyObject **keys = PySequence_Fast_ITEMS(engine), **values = PySequence_Fast_ITEMS(owns);
    if (PySequence_Fast_GET_SIZE(owns) != n) {
        PyErr_SetString(PyExc_ValueError, "engine hashes and router hashes differ in length");
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        int found = PyDict_Contains(own_of, keys[i]);
        if (found != 0)
            return found < 0 ? -1 : 2;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (PyDict_SetItem(own_of, keys[i], values[i]) < 0)
            return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        int found = PyDict_Contains(masks, values[i]);
        if (found != 0)
            return found < 0 ? -1 : 1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (PyDict_SetItem(masks, values[i], bit) < 0)
            return -1;
    }
    return 0;
}

static PyObject *store_new(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "store_new takes 5 arguments");
        return NULL;
    }
    PyObject *own_of = args[0], *masks = args[1];
    if (!PyDict_CheckExact(own_of) || !PyDict_CheckExact(masks)) {
        PyErr_SetString(PyExc_TypeError, "store_new(dict, dict, hashes, owns, bit)");
        return NULL;
    }
    PyObject *engine = PySequence_Fast(args[2], "engine hashes must be a sequence");
    if (engine == NULL)
        return NULL;
    PyObject *owns = PySequence_Fast(args[3], "router hashes must be a sequence");
    if (owns == NULL) {
        Py_DECREF(engine);
        return NULL;
    }
    int status = store_new_seq(own_of, masks, engine, owns, args[4]);
    Py_DECREF(engine);
    Py_DECREF(owns);
    return status < 0 ? NULL : PyLong_FromLong(status);
}

/* A BlockRemoved where each engine hash names a block of its own (no copies, no aliases):
 * pop each known engine hash from `own_of`, and clear the worker's bit from its router
 * hash's mask (`keep` is the bit's complement), dropping a mask left empty. */
static PyObject *remove_plain(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "remove_plain takes 4 arguments");
        return NULL;
    }
    PyObject *own_of = args[0], *masks = args[1], *keep = args[3];
    if (!PyDict_CheckExact(own_of) || !PyDict_CheckExact(masks)) {
        PyErr_SetString(PyExc_TypeError, "remove_plain(dict, dict, hashes, keep)");
        return NULL;
    }
    PyObject *engine = PySequence_Fast(args[2], "engine hashes must be a sequence");
    if (engine == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(engine); i++) {
        PyObject *key = PySequence_Fast_GET_ITEM(engine, i);
        PyObject *own = PyDict_GetItemWithError(own_of, key);
        if (own == NULL) {
            if (PyErr_Occurred()) {
                Py_DECREF(engine);
                return NULL;
            }
            continue; /* unknown: a block we skipped, or never saw stored */
        }
        Py_INCREF(own);
        if (PyDict_DelItem(own_of, key) < 0)
            goto fail;
        PyObject *mask = PyDict_GetItemWithError(masks, own);
        if (mask == NULL) {
            if (!PyErr_Occurred())
                PyErr_SetObject(PyExc_KeyError, own);
            goto fail;
        }
        PyObject *left = PyNumber_And(mask, keep);
        if (left == NULL)
            goto fail;
        int nonzero = PyObject_IsTrue(left);
        int status = nonzero > 0   ? PyDict_SetItem(masks, own, left)
                     : nonzero == 0 ? PyDict_DelItem(masks, own)
                                    : -1;
        Py_DECREF(left);
        if (status < 0)
            goto fail;
        Py_DECREF(own);
        continue;
    fail:
        Py_DECREF(own);
        Py_DECREF(engine);
        return NULL;
    }
    Py_DECREF(engine);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"store_new", (PyCFunction)(void (*)(void))store_new, METH_FASTCALL,
     "store_new(own_of, masks, engine_hashes, owns, bit) -> 0, 1 or 2 (see index.py)."},
    {"remove_plain", (PyCFunction)(void (*)(void))remove_plain, METH_FASTCALL,
     "remove_plain(own_of, masks, engine_hashes, keep) -> None (see index.py)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_index", "The KV index's common dict operations in C.", -1,
    methods,
};

PyMODINIT_FUNC PyInit__index(void) { return PyModule_Create(&module); }
