/* The C form of switchyard.common.engines.frames (FrameReader, ReplyBatch): see frames.py
 * for what they do, _frames_core.h for how. This file is only the Python glue: argument
 * checks, references, and events as tuples. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include "_frames_core.h"

/* ---- ReplyBatch ------------------------------------------------------------------------ */

typedef struct {
    PyObject_HEAD
    fr_buf buf;
} ReplyBatch;

static PyTypeObject ReplyBatchType;

static void batch_dealloc(ReplyBatch *self)
{
    fr_buf_free(&self->buf);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *batch_append(ReplyBatch *self, PyObject *arg)
{
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    int failed = fr_put(&self->buf, (const uint8_t *)view.buf, (size_t)view.len);
    PyBuffer_Release(&view);
    if (failed)
        return PyErr_NoMemory();
    self->buf.count++;
    Py_RETURN_NONE;
}

static PyObject *batch_take(ReplyBatch *self, PyObject *Py_UNUSED(ignored))
{
    if (self->buf.count == 0)
        Py_RETURN_NONE;
    uint8_t head[5];
    size_t head_len = mp_array_header(head, self->buf.count);
    PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(head_len + self->buf.len));
    if (out == NULL)
        return NULL;
    char *dst = PyBytes_AS_STRING(out);
    memcpy(dst, head, head_len);
    memcpy(dst + head_len, self->buf.data, self->buf.len);
    self->buf.len = 0;
    self->buf.count = 0;
    if (self->buf.cap > 1 << 20) { /* after a burst, give the memory back */
        fr_buf_free(&self->buf);
    }
    return out;
}

static PyObject *batch_get_count(ReplyBatch *self, void *Py_UNUSED(closure))
{
    return PyLong_FromUnsignedLong(self->buf.count);
}

static PyMethodDef batch_methods[] = {
    {"append", (PyCFunction)batch_append, METH_O, "One reply, msgpack-encoded."},
    {"take", (PyCFunction)batch_take, METH_NOARGS,
     "Every reply so far as one msgpack array (None: none); the batch is empty after."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef batch_getset[] = {
    {"count", (getter)batch_get_count, NULL, "replies in the batch", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject ReplyBatchType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "switchyard.common.engines._frames.ReplyBatch",
    .tp_basicsize = sizeof(ReplyBatch),
    .tp_dealloc = (destructor)batch_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Encoded replies for one peer (see frames.ReplyBatch).",
    .tp_methods = batch_methods,
    .tp_getset = batch_getset,
    .tp_new = PyType_GenericNew,
};

/* ---- FrameReader ----------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    fr_reader r;
} FrameReader;

static void stream_release(fr_stream *s)
{
    Py_XDECREF((PyObject *)s->sink_ref);
    Py_XDECREF((PyObject *)s->owner);
    fr_stream_free(s);
}

static int reader_clear(FrameReader *self)
{
    fr_reader *r = &self->r;
    for (size_t i = 0; i < r->nslots; i++) {
        fr_stream *s = r->slots[i];
        if (s != NULL && s != FR_TOMB) {
            r->slots[i] = FR_TOMB;
            r->used--;
            stream_release(s);
        }
    }
    for (size_t i = 0; i < r->nfirsts; i++)
        Py_XDECREF((PyObject *)r->firsts[i]);
    r->nfirsts = 0;
    return 0;
}

static int reader_traverse(FrameReader *self, visitproc visit, void *arg)
{
    fr_reader *r = &self->r;
    for (size_t i = 0; i < r->nslots; i++) {
        fr_stream *s = r->slots[i];
        if (s != NULL && s != FR_TOMB) {
            Py_VISIT((PyObject *)s->sink_ref);
            Py_VISIT((PyObject *)s->owner);
        }
    }
    for (size_t i = 0; i < r->nfirsts; i++)
        Py_VISIT((PyObject *)r->firsts[i]);
    return 0;
}

static void reader_dealloc(FrameReader *self)
{
    PyObject_GC_UnTrack(self);
    reader_clear(self);
    fr_reader *r = &self->r;
    free(r->slots);
    free(r->firsts);
    free(r->ids.ids);
    fr_buf_free(&r->in);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int reader_init(FrameReader *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"max_message", "refill", NULL};
    long long max_message, refill;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "LL", kwlist, &max_message, &refill))
        return -1;
    if (max_message < 0 || refill < 1) {
        PyErr_SetString(PyExc_ValueError, "max_message must be >= 0 and refill >= 1");
        return -1;
    }
    reader_clear(self);
    free(self->r.slots);
    free(self->r.firsts);
    free(self->r.ids.ids);
    fr_buf_free(&self->r.in);
    fr_reader_init(&self->r, (uint64_t)max_message, (uint64_t)refill);
    return 0;
}

static int stream_id_arg(PyObject *arg, uint32_t *id)
{
    unsigned long value = PyLong_AsUnsignedLong(arg);
    if (value == (unsigned long)-1 && PyErr_Occurred())
        return -1;
    if (value > 0x7fffffffUL) {
        PyErr_SetString(PyExc_ValueError, "a stream id is below 2^31");
        return -1;
    }
    *id = (uint32_t)value;
    return 0;
}

static PyObject *reader_relay(FrameReader *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"stream_id", "sink", "request_id", "layout", "owner", NULL};
    PyObject *id_obj, *sink, *rid_obj, *owner = Py_None;
    Py_ssize_t rid_len;
    int layout;
    uint32_t id;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOUi|O", kwlist, &id_obj, &sink, &rid_obj,
                                     &layout, &owner))
        return NULL;
    if (stream_id_arg(id_obj, &id) < 0)
        return NULL;
    const char *rid = PyUnicode_AsUTF8AndSize(rid_obj, &rid_len);
    if (rid == NULL)
        return NULL;
    if (layout != FR_SGLANG && layout != FR_VLLM) {
        PyErr_Format(PyExc_ValueError, "unknown layout %d", layout);
        return NULL;
    }
    if (!PyObject_TypeCheck(sink, &ReplyBatchType)) {
        PyErr_SetString(PyExc_TypeError, "sink must be a ReplyBatch");
        return NULL;
    }
    fr_stream *s = fr_stream_new(id, layout, &((ReplyBatch *)sink)->buf, rid, (size_t)rid_len);
    if (s == NULL)
        return PyErr_NoMemory();
    fr_stream *old = fr_take(&self->r, id);
    if (old != NULL)
        stream_release(old);
    if (fr_insert(&self->r, s)) {
        fr_stream_free(s);
        return PyErr_NoMemory();
    }
    Py_INCREF(sink);
    s->sink_ref = sink;
    if (owner != Py_None) {
        Py_INCREF(owner);
        s->owner = owner;
    }
    Py_RETURN_NONE;
}

static PyObject *reader_forget(FrameReader *self, PyObject *arg)
{
    uint32_t id;
    if (stream_id_arg(arg, &id) < 0)
        return NULL;
    fr_stream *s = fr_take(&self->r, id);
    if (s != NULL)
        stream_release(s);
    Py_RETURN_NONE;
}

static PyObject *reader_take_firsts(FrameReader *self, PyObject *Py_UNUSED(ignored))
{
    fr_reader *r = &self->r;
    if (r->nfirsts == 0)
        Py_RETURN_NONE;
    PyObject *list = PyList_New((Py_ssize_t)r->nfirsts);
    if (list == NULL)
        return NULL;
    for (size_t i = 0; i < r->nfirsts; i++)
        PyList_SET_ITEM(list, (Py_ssize_t)i, (PyObject *)r->firsts[i]); /* the reference moves */
    r->nfirsts = 0;
    return list;
}

static PyObject *reader_feed(FrameReader *self, PyObject *arg)
{
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    int failed = view.len ? fr_reader_feed(&self->r, (const uint8_t *)view.buf, (size_t)view.len)
                          : 0;
    PyBuffer_Release(&view);
    if (failed)
        return PyErr_NoMemory();
    fr_event ev;
    int rc = fr_next(&self->r, &ev);
    if (rc < 0)
        return PyErr_NoMemory();
    if (rc == 0)
        Py_RETURN_NONE;
    if (ev.kind == FR_REFILL)
        return Py_BuildValue("(iiiK)", ev.kind, 0, 0, (unsigned long long)ev.amount);
    if (ev.kind == FR_HANDBACK) {
        PyObject *out = Py_BuildValue("(iiI(y#KK))", ev.kind, 0, (unsigned int)ev.stream_id,
                                      ev.len ? (const char *)ev.payload : "", (Py_ssize_t)ev.len,
                                      (unsigned long long)ev.received,
                                      (unsigned long long)ev.tokens);
        stream_release(ev.gone);
        return out;
    }
    return Py_BuildValue("(iiIy#)", ev.kind, ev.flags, (unsigned int)ev.stream_id,
                         ev.len ? (const char *)ev.payload : "", (Py_ssize_t)ev.len);
}

static PyObject *reader_get_relayed(FrameReader *self, void *Py_UNUSED(closure))
{
    return PyLong_FromUnsignedLongLong(self->r.relayed);
}

static PyObject *reader_get_received(FrameReader *self, void *Py_UNUSED(closure))
{
    return PyLong_FromUnsignedLongLong(self->r.received);
}

static PyObject *reader_get_max_message(FrameReader *self, void *Py_UNUSED(closure))
{
    return PyLong_FromUnsignedLongLong(self->r.max_message);
}

static PyObject *reader_get_refill(FrameReader *self, void *Py_UNUSED(closure))
{
    return PyLong_FromUnsignedLongLong(self->r.refill);
}

static PyMethodDef reader_methods[] = {
    {"relay", (PyCFunction)(void (*)(void))reader_relay, METH_VARARGS | METH_KEYWORDS,
     "relay(stream_id, sink, request_id, layout, owner=None)"},
    {"forget", (PyCFunction)reader_forget, METH_O, "Stop relaying a stream."},
    {"feed", (PyCFunction)reader_feed, METH_O, "Bytes read: the first event, or None."},
    {"take_firsts", (PyCFunction)reader_take_firsts, METH_NOARGS,
     "Owners of streams whose first delta was written since the last call (None: none)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef reader_getset[] = {
    {"relayed", (getter)reader_get_relayed, NULL, "TokenDeltas written so far", NULL},
    {"received", (getter)reader_get_received, NULL, "DATA bytes since the last REFILL", NULL},
    {"max_message", (getter)reader_get_max_message, NULL, NULL, NULL},
    {"refill", (getter)reader_get_refill, NULL, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject FrameReaderType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "switchyard.common.engines._frames.FrameReader",
    .tp_basicsize = sizeof(FrameReader),
    .tp_dealloc = (destructor)reader_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The frames of one HTTP/2 connection (see frames.FrameReader).",
    .tp_traverse = (traverseproc)reader_traverse,
    .tp_clear = (inquiry)reader_clear,
    .tp_methods = reader_methods,
    .tp_getset = reader_getset,
    .tp_init = (initproc)reader_init,
    .tp_new = PyType_GenericNew,
};

static struct PyModuleDef frames_module = {
    PyModuleDef_HEAD_INIT, "_frames",
    "HTTP/2 frames and the relay of plain token chunks, in C (see frames.py).", -1, NULL,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__frames(void)
{
    if (PyType_Ready(&ReplyBatchType) < 0 || PyType_Ready(&FrameReaderType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&frames_module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&ReplyBatchType);
    if (PyModule_AddObject(m, "ReplyBatch", (PyObject *)&ReplyBatchType) < 0) {
        Py_DECREF(&ReplyBatchType);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&FrameReaderType);
    if (PyModule_AddObject(m, "FrameReader", (PyObject *)&FrameReaderType) < 0) {
        Py_DECREF(&FrameReaderType);
        Py_DECREF(m);
        return NULL;
    }
    if (PyModule_AddIntConstant(m, "HANDBACK", FR_HANDBACK) < 0 ||
        PyModule_AddIntConstant(m, "REFILL", FR_REFILL) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
