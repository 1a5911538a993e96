/* The two readers of heads.py in C: split_request and PlainAnswers.take, same contracts.
 *
 * heads.py's regular expressions are the reference: they run where this module was not
 * built, and tests/test_proxy_heads.py holds this reader to them (and both to httptools)
 * on hand-picked heads and on mutated ones. Each reader walks the head once, left to
 * right, and never reads past the bytes object it was given: every access is behind an
 * index check against its length. Why C: both readers are on every plain read's path, and
 * the interpreter's cost for them there is mostly cold caches (bench/README.md). */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

#define HEAD_LIMIT (16 << 10)
#define LENGTH_DIGITS 18

/* RFC 9110 tchar */
static unsigned char is_token[256];
/* a field value byte: HTAB, SP, VCHAR, obs-text (never CR, LF or another control) */
static unsigned char is_value[256];
/* a request target byte of origin-form: VCHAR but '#' */
static unsigned char is_target[256];

static PyObject *str_get, *str_head;

static void
fill_tables(void)
{
    const char *extra = "!#$%&'*+.^_`|~-";
    for (int c = '0'; c <= '9'; c++) is_token[c] = 1;
    for (int c = 'a'; c <= 'z'; c++) is_token[c] = 1;
    for (int c = 'A'; c <= 'Z'; c++) is_token[c] = 1;
    for (const char *e = extra; *e; e++) is_token[(unsigned char)*e] = 1;
    is_value['\t'] = 1;
    for (int c = 0x20; c <= 0x7e; c++) is_value[c] = 1;
    for (int c = 0x80; c <= 0xff; c++) is_value[c] = 1;
    for (int c = 0x21; c <= 0x7e; c++) is_target[c] = 1;
    is_target['#'] = 0;
}

static inline unsigned char
lower(unsigned char c)
{
    return (c >= 'A' && c <= 'Z') ? (unsigned char)(c + 32) : c;
}

/* s[0:n] equals the lower-case ASCII name, in any case */
static int
same_name(const unsigned char *s, Py_ssize_t n, const char *name, Py_ssize_t name_len)
{
    if (n != name_len) return 0;
    for (Py_ssize_t k = 0; k < n; k++)
        if (lower(s[k]) != (unsigned char)name[k]) return 0;
    return 1;
}

static inline int
crlf_at(const unsigned char *s, Py_ssize_t n, Py_ssize_t i)
{
    return i + 1 < n && s[i] == '\r' && s[i + 1] == '\n';
}

/* s[0:n] is one of `names` (a tuple of lower-case bytes), in any case */
static int
named(PyObject *names, const unsigned char *s, Py_ssize_t n)
{
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(names); k++) {
        PyObject *name = PyTuple_GET_ITEM(names, k);
        if (same_name(s, n, PyBytes_AS_STRING(name), PyBytes_GET_SIZE(name))) return 1;
    }
    return 0;
}

/* request_reader(refused)(data) -> (method, target, [(name, value)]) | None: see
 * heads.split_request. `refused` (its self) is a tuple of lower-case names that make a
 * request other than the plainest; Connection is refused unless it is "keep-alive". */
static PyObject *
split_request(PyObject *refused, PyObject *arg)
{
    if (!PyBytes_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "split_request takes bytes");
        return NULL;
    }
    const unsigned char *s = (const unsigned char *)PyBytes_AS_STRING(arg);
    Py_ssize_t n = PyBytes_GET_SIZE(arg), i;
    PyObject *method;
    if (n > HEAD_LIMIT) Py_RETURN_NONE;
    if (n >= 4 && memcmp(s, "GET ", 4) == 0) {
        method = str_get;
        i = 4;
    }
    else if (n >= 5 && memcmp(s, "HEAD ", 5) == 0) {
        method = str_head;
        i = 5;
    }
    else
        Py_RETURN_NONE;
    Py_ssize_t target = i;
    if (i >= n || s[i] != '/') Py_RETURN_NONE;
    while (i < n && is_target[s[i]]) i++;
    Py_ssize_t target_end = i;
    if (n - i < 11 || memcmp(s + i, " HTTP/1.1\r\n", 11) != 0) Py_RETURN_NONE;
    i += 11;

    /* first pass: the grammar, whole; nothing is built for a head that is refused */
    Py_ssize_t fields_start = i, count = 0;
    while (!crlf_at(s, n, i)) {
        Py_ssize_t name = i;
        while (i < n && is_token[s[i]]) i++;
        if (i == name || i >= n || s[i] != ':') Py_RETURN_NONE;
        i++;
        while (i < n && is_value[s[i]]) i++;
        if (!crlf_at(s, n, i)) Py_RETURN_NONE;
        i += 2;
        count++;
    }
    if (i + 2 != n) Py_RETURN_NONE; /* the blank line ends the bytes */

    /* second pass: the fields, names in lower case, values without surrounding OWS */
    PyObject *fields = PyList_New(count);
    if (fields == NULL) return NULL;
    i = fields_start;
    for (Py_ssize_t f = 0; f < count; f++) {
        Py_ssize_t name = i;
        while (s[i] != ':') i++;
        Py_ssize_t name_len = i - name, value = i + 1, value_end;
        i = value;
        while (s[i] != '\r') i++;
        value_end = i;
        i += 2;
        while (value < value_end && (s[value] == ' ' || s[value] == '\t')) value++;
        while (value_end > value && (s[value_end - 1] == ' ' || s[value_end - 1] == '\t'))
            value_end--;
        const unsigned char *v = s + value;
        Py_ssize_t value_len = value_end - value;
        if (same_name(s + name, name_len, "connection", 10)) {
            if (!same_name(v, value_len, "keep-alive", 10)) goto refused;
        }
        else if (named(refused, s + name, name_len))
            goto refused;
        PyObject *lowered = PyBytes_FromStringAndSize(NULL, name_len);
        if (lowered == NULL) goto failed;
        char *out = PyBytes_AS_STRING(lowered);
        for (Py_ssize_t k = 0; k < name_len; k++) out[k] = (char)lower(s[name + k]);
        PyObject *pair = Py_BuildValue("(Ny#)", lowered, (const char *)v, value_len);
        if (pair == NULL) goto failed;
        PyList_SET_ITEM(fields, f, pair);
    }
    PyObject *path = PyBytes_FromStringAndSize((const char *)s + target, target_end - target);
    if (path == NULL) goto failed;
    return Py_BuildValue("(ONN)", method, path, fields);

refused:
    Py_DECREF(fields);
    Py_RETURN_NONE;
failed:
    Py_DECREF(fields);
    return NULL;
}

/* take_answer(barred)(data, has_body) -> (status, head_end) | None: see heads.PlainAnswers.
 * `barred` (its self) is a tuple of lower-case names. */
static PyObject *
take_answer(PyObject *barred, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyBytes_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "take(data: bytes, has_body: bool)");
        return NULL;
    }
    int has_body = PyObject_IsTrue(args[1]);
    if (has_body < 0) return NULL;
    const unsigned char *s = (const unsigned char *)PyBytes_AS_STRING(args[0]);
    Py_ssize_t n = PyBytes_GET_SIZE(args[0]), i = 13;

    /* an HTTP/1.1 status line of a final status (2xx to 5xx) */
    if (n < 13 || memcmp(s, "HTTP/1.1 ", 9) != 0) Py_RETURN_NONE;
    if (s[9] < '2' || s[9] > '5' || s[10] < '0' || s[10] > '9' || s[11] < '0' ||
        s[11] > '9' || s[12] != ' ')
        Py_RETURN_NONE;
    long status = (s[9] - '0') * 100 + (s[10] - '0') * 10 + (s[11] - '0');
    while (i < n && is_value[s[i]]) i++;
    if (!crlf_at(s, n, i)) Py_RETURN_NONE;
    i += 2;

    int dated = 0, framed = 0;
    long long length = 0;
    while (!crlf_at(s, n, i)) {
        if (i > HEAD_LIMIT) Py_RETURN_NONE; /* the head would end past it */
        Py_ssize_t name = i;
        while (i < n && is_token[s[i]]) i++;
        if (i == name || i >= n || s[i] != ':') Py_RETURN_NONE;
        Py_ssize_t name_len = i - name;
        i++;
        if (same_name(s + name, name_len, "date", 4)) {
            dated = 1;
        }
        else if (same_name(s + name, name_len, "content-length", 14)) {
            if (framed) Py_RETURN_NONE; /* one Content-Length, no more */
            while (i < n && (s[i] == ' ' || s[i] == '\t')) i++;
            Py_ssize_t digits = i;
            while (i < n && s[i] >= '0' && s[i] <= '9') i++;
            if (i == digits || i - digits > LENGTH_DIGITS) Py_RETURN_NONE;
            for (Py_ssize_t k = digits; k < i; k++) length = length * 10 + (s[k] - '0');
            while (i < n && (s[i] == ' ' || s[i] == '\t')) i++;
            if (!crlf_at(s, n, i)) Py_RETURN_NONE;
            i += 2;
            framed = 1;
            continue;
        }
        else if (named(barred, s + name, name_len))
            Py_RETURN_NONE;
        while (i < n && is_value[s[i]]) i++;
        if (!crlf_at(s, n, i)) Py_RETURN_NONE;
        i += 2;
    }
    Py_ssize_t end = i + 2;
    if (!framed || !dated || end > HEAD_LIMIT) Py_RETURN_NONE;
    long long body = (!has_body || status == 204 || status == 304) ? 0 : length;
    if ((long long)(n - end) != body) Py_RETURN_NONE;
    return Py_BuildValue("(ln)", status, end);
}

static PyMethodDef split_request_def = {
    "split_request", split_request, METH_O,
    "split_request(data) -> (method, target, fields) | None"};

static PyMethodDef take_answer_def = {
    "take", (PyCFunction)(void (*)(void))take_answer, METH_FASTCALL,
    "take(data, has_body) -> (status, head_end) | None"};

/* `def` bound to `names`, a tuple of lower-case header names (checked here, once) */
static PyObject *
reader(PyMethodDef *def, PyObject *names)
{
    if (!PyTuple_Check(names)) {
        PyErr_Format(PyExc_TypeError, "%s: a reader takes a tuple of bytes", def->ml_name);
        return NULL;
    }
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(names); k++) {
        PyObject *name = PyTuple_GET_ITEM(names, k);
        if (!PyBytes_Check(name)) {
            PyErr_Format(PyExc_TypeError, "%s: a reader takes a tuple of bytes", def->ml_name);
            return NULL;
        }
        const char *text = PyBytes_AS_STRING(name);
        for (Py_ssize_t c = 0; c < PyBytes_GET_SIZE(name); c++)
            if (text[c] >= 'A' && text[c] <= 'Z') {
                PyErr_Format(PyExc_ValueError, "%s: a reader takes lower-case names, got %R",
                             def->ml_name, name);
                return NULL;
            }
    }
    return PyCFunction_New(def, names);
}

/* request_reader(refused) -> split_request, for those lower-case names */
static PyObject *
request_reader(PyObject *module, PyObject *arg)
{
    return reader(&split_request_def, arg);
}

/* answer_reader(barred) -> take: PlainAnswers.take for those lower-case names */
static PyObject *
answer_reader(PyObject *module, PyObject *arg)
{
    return reader(&take_answer_def, arg);
}

static PyMethodDef methods[] = {
    {"request_reader", request_reader, METH_O, "request_reader(refused) -> split_request"},
    {"answer_reader", answer_reader, METH_O, "answer_reader(barred) -> take"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_heads", "heads.py's two readers in C", -1, methods,
};

PyMODINIT_FUNC
PyInit__heads(void)
{
    fill_tables();
    str_get = PyUnicode_InternFromString("GET");
    str_head = PyUnicode_InternFromString("HEAD");
    if (str_get == NULL || str_head == NULL) return NULL;
    PyObject *module = PyModule_Create(&module_def);
    if (module == NULL) return NULL;
    if (PyModule_AddIntConstant(module, "HEAD_LIMIT", HEAD_LIMIT) < 0 ||
        PyModule_AddIntConstant(module, "LENGTH_DIGITS", LENGTH_DIGITS) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
