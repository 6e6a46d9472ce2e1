/* libFuzzer harness for the prompt's pre-tokens in C (services/preprocessor/_pretokens.c): the
 * split and cache look-up of text an HTTP client sends.
 *
 * It runs the extension's deepseek_v3 in an embedded interpreter (Python's allocator is plain
 * malloc here, so ASan sees every buffer) against its Python form, the regex of pretokens.py
 * (run.py passes it in SWITCHYARD_PRETOKENS_REGEX): with an empty cache it must name the
 * regex's pre-tokens, each once in order of first use; with every one cached, return their
 * ids joined, and leave the cached lists' reference counts as they were.
 *
 * The first input byte says whether '<' is plain (an added token starts with it, or none
 * does); the rest is the text, one character per byte (Latin-1: above 127 is not plain).
 *
 *   make fuzz                    (builds with clang -fsanitize=fuzzer,address,undefined)
 */
#include <stdio.h>
#include <stdlib.h>

#include "../../../services/preprocessor/_pretokens.c"

static PyObject *check, *native; /* check(native, data), defined by CHECK */

/* Python's objects live until exit: no leak report for them. */
const char *__asan_default_options(void) { return "detect_leaks=0"; }

static const char CHECK[] =
    "import os, re, sys\n"
    "split = re.compile(os.environ['SWITCHYARD_PRETOKENS_REGEX']).findall\n"
    "def check(native, data):\n"
    "    plain = {*map(chr, [9, 10, 11, 12, 13, *range(32, 127)])} - ({'<'} if data[0] & 1 else set())\n"
    "    table = bytes(chr(c) in plain for c in range(128))\n"
    "    text = data[1:].decode('latin-1')\n"
    "    missing = native(table, {}, text)\n"
    "    if not set(text) <= plain:\n"
    "        assert missing is None, missing\n"
    "        return\n"
    "    pieces = split(text)\n"
    "    assert ''.join(pieces) == text, pieces\n"
    "    assert missing == (tuple(dict.fromkeys(pieces)) if text else []), (missing, pieces)\n"
    "    cache = {p: [i, len(p)] for i, p in enumerate(missing)}\n"
    "    refs = [sys.getrefcount(ids) for ids in cache.values()]\n"
    "    ids = native(table, cache, text)\n"
    "    assert ids == [i for p in pieces for i in cache[p]], ids\n"
    "    assert refs == [sys.getrefcount(ids) for ids in cache.values()], 'refcounts'\n";

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    setenv("PYTHONMALLOC", "malloc", 1);
    unsetenv("PYTHONOPTIMIZE"); /* CHECK asserts */
    Py_InitializeEx(0);
    pt_init();
    PyObject *globals = PyDict_New();
    native = PyCFunction_New(&methods[0], NULL);
    if (globals == NULL || native == NULL || PyDict_SetItemString(globals, "__builtins__",
                                                                  PyEval_GetBuiltins()) < 0)
        abort();
    PyObject *done = PyRun_String(CHECK, Py_file_input, globals, globals);
    check = PyDict_GetItemString(globals, "check");
    if (done == NULL || check == NULL) {
        PyErr_Print();
        abort();
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    PyObject *bytes = PyBytes_FromStringAndSize((const char *)data, (Py_ssize_t)size);
    PyObject *done = PyObject_CallFunction(check, "ON", native, bytes);
    if (done == NULL) {
        PyErr_Print();
        fprintf(stderr, "pretokens_fuzz: the C form and the Python form differ\n");
        abort();
    }
    Py_DECREF(done);
    return 0;
}
