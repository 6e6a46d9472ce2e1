/* Plain ASCII text -> its pre-tokens' cached ids, in one call (pretokens.py's hot path in C).
 *
 *   deepseek_v3(plain, cache, text)
 *       plain: 128 bytes, nonzero for each character the text may hold;
 *       cache: dict of pre-token -> list of ids;
 *       -> the ids of the text (a list), the pre-tokens not in the cache (a tuple, in order
 *          of first use, each once), or None when the text holds another character.
 *
 * The split is pretokens.py's _DEEPSEEK_V3_PIECES regex, written out for ASCII: pretokens.py
 * keeps the regex (the fallback, and the reference the tests compare this with). At each
 * position the regex's first alternative that matches wins; pt_piece follows them in order.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

enum { DIGIT = 1, LETTER = 2, PUNCT = 4, BLANK = 8, BREAK = 16 }; /* BLANK: \t \v \f space */
#define SPACE (BLANK | BREAK)

static uint8_t CLS[128]; /* 0: a control character the pre-tokens never hold */

static void pt_init(void)
{
    for (int c = 0; c < 128; c++) {
        if (c >= '0' && c <= '9')
            CLS[c] = DIGIT;
        else if ((c | 32) >= 'a' && (c | 32) <= 'z')
            CLS[c] = LETTER;
        else if (c == '\r' || c == '\n')
            CLS[c] = BREAK;
        else if (c == ' ' || c == '\t' || c == '\v' || c == '\f')
            CLS[c] = BLANK;
        else if (c > ' ' && c < 127)
            CLS[c] = PUNCT;
    }
}

static size_t pt_run(const uint8_t *s, size_t i, size_t n, int cls)
{
    while (i < n && (CLS[s[i]] & cls))
        i++;
    return i;
}

/* The end of the pre-token that starts at s[i] (i < n; every s[k] < 128, CLS[s[k]] != 0). */
static size_t pt_piece(const uint8_t *s, size_t i, size_t n)
{
    int c = CLS[s[i]];
    int next = i + 1 < n ? CLS[s[i + 1]] : 0;
    if (c == DIGIT) /* [0-9]{1,3} */
        return pt_run(s, i + 1, i + 3 < n ? i + 3 : n, DIGIT);
    if (c == LETTER) /* [A-Za-z]+ (an empty optional first character) */
        return pt_run(s, i + 1, n, LETTER);
    if ((c == PUNCT || c == BLANK) && next == LETTER) /* [PUNCT][A-Za-z]+, [^...]?[A-Za-z]+ */
        return pt_run(s, i + 2, n, LETTER);
    if (c == PUNCT || (s[i] == ' ' && next == PUNCT)) /* ' ?[PUNCT]+[\r\n]*' */
        return pt_run(s, pt_run(s, i + 1, n, PUNCT), n, BREAK);
    size_t end = pt_run(s, i + 1, n, SPACE);
    for (size_t k = end; k > i; k--) /* [SPACE]*[\r\n]+: through the run's last line break */
        if (CLS[s[k - 1]] == BREAK)
            return k;
    if (end == n || CLS[s[end]] == DIGIT || end - i == 1) /* [SPACE]+(?!...), [SPACE]+ */
        return end;
    return end - 1; /* [SPACE]+(?![^SPACE0-9]): the last one goes with the next word */
}

#define STACK_PIECES 256

static PyObject *deepseek_v3(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 3 || !PyBytes_Check(args[0]) || PyBytes_GET_SIZE(args[0]) != 128 ||
        !PyDict_Check(args[1]) || !PyUnicode_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "deepseek_v3(plain: bytes[128], cache: dict, text: str)");
        return NULL;
    }
    const char *plain = PyBytes_AS_STRING(args[0]);
    PyObject *cache = args[1], *text = args[2];
    if (!PyUnicode_IS_ASCII(text))
        Py_RETURN_NONE;
    const uint8_t *s = PyUnicode_1BYTE_DATA(text);
    size_t n = (size_t)PyUnicode_GET_LENGTH(text);
    for (size_t i = 0; i < n; i++)
        if (!plain[s[i]] || !CLS[s[i]])
            Py_RETURN_NONE;

    /* The cached lists, borrowed: nothing here runs Python code or changes the cache. */
    PyObject *stack[STACK_PIECES], **found = stack, *missing = NULL, *out = NULL;
    if (n > STACK_PIECES && (found = PyMem_Malloc(n * sizeof(PyObject *))) == NULL)
        return PyErr_NoMemory();
    size_t count = 0;
    Py_ssize_t total = 0;
    for (size_t i = 0, j; i < n; i = j) {
        j = pt_piece(s, i, n);
        PyObject *key = PyUnicode_Substring(text, (Py_ssize_t)i, (Py_ssize_t)j);
        if (key == NULL)
            goto done;
        PyObject *ids = PyDict_GetItemWithError(cache, key);
        int ok = 1;
        if (ids != NULL && !PyList_Check(ids)) {
            PyErr_SetString(PyExc_TypeError, "cached ids must be a list");
            ok = 0;
        } else if (ids != NULL && missing == NULL) {
            found[count++] = ids;
            total += PyList_GET_SIZE(ids);
        } else if (ids == NULL && PyErr_Occurred()) {
            ok = 0;
        } else if (ids == NULL) { /* from here on only the missing ones are collected */
            if (missing == NULL)
                missing = PyDict_New();
            ok = missing != NULL && PyDict_SetItem(missing, key, Py_None) == 0;
        }
        Py_DECREF(key);
        if (!ok)
            goto done;
    }
    if (missing != NULL) {
        out = PySequence_Tuple(missing);
        goto done;
    }
    if ((out = PyList_New(total)) == NULL)
        goto done;
    Py_ssize_t at = 0;
    for (size_t k = 0; k < count; k++) {
        PyObject *ids = found[k];
        for (Py_ssize_t m = 0; m < PyList_GET_SIZE(ids); m++) {
            PyObject *id = PyList_GET_ITEM(ids, m);
            Py_INCREF(id);
            PyList_SET_ITEM(out, at++, id);
        }
    }
done:
    Py_XDECREF(missing);
    if (found != stack)
        PyMem_Free(found);
    return out;
}

static PyMethodDef methods[] = {
    {"deepseek_v3", (PyCFunction)(void (*)(void))deepseek_v3, METH_FASTCALL,
     "deepseek_v3(plain, cache, text) -> list[int] | tuple[str, ...] | None: the ids of "
     "plain ASCII text from cached pre-tokens, or the pre-tokens not cached."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_pretokens",
    "Pre-tokenization of plain ASCII text and its cached ids, in C.", -1, methods,
};

PyMODINIT_FUNC PyInit__pretokens(void)
{
    pt_init();
    return PyModule_Create(&module);
}
