/* forkserve/http/_h1.c: the usual request head in and the usual response
 * head out, in C, for forkserve.http.protocol.Connection (forkserve.cext
 * says when it is used).
 *
 * Three functions, each the fast path of Python code that stays the
 * reference, and the record the first one makes (_h1_connection.c, the
 * module's other part, is the connection object's per-request steps, which
 * call the first two):
 *
 *   Request
 *       forkserve.http.protocol.Request's fields and constructor, in C, so
 *       that parse_head makes a request without a call into Python;
 *       forkserve.http.protocol uses it whenever this module is built.
 *   parse_head(buf, pos, window, fields_max, base=None)
 *       the whole of Connection._next_head's first step and _head_done's
 *       rules for a head in its usual form: a request line and field lines
 *       as forkserve.http.h1._HEAD matches them, every field name once, an
 *       origin-form target, a Host of letters, digits and the reg-name
 *       marks with an optional port, a Connection of one token, no
 *       Transfer-Encoding. Returns (end, request, keep): `end` the offset
 *       after the blank line, `request` a Request (this module's, the C
 *       form of forkserve.http.protocol.Request) whose `headers` are keyed
 *       as the environ keys them, `keep` what the request asks of the
 *       connection. Given `base` (the part of an environ that is the same
 *       for every request, with an empty SCRIPT_NAME), `headers` is instead
 *       the request's whole environ, as
 *       forkserve.http.environ.request_environ makes it, and is also its
 *       `environ`.
 *   build_head(status, headers, total, chunk_ok, http10, head_request, keep, date)
 *       forkserve.http.response.build_head for headers that are (str, str)
 *       tuples of valid names and latin-1 values. Returns (code, head,
 *       declared, chunked, keep).
 *   http_date()
 *       forkserve.http.response.python_http_date: the Date value for now.
 *
 * Invariants:
 * - Either function returns None for anything outside what it handles
 *   (a head not here whole, a repeated field, an absolute-form target, a
 *   header value outside latin-1, a 1xx status...), and never raises for
 *   the client's or the application's input: the Python code then runs on
 *   the same input and gives the answer or the error, with its message. So
 *   every refusal is decided in one place, in Python.
 * - Where they return a result, it is the one the Python code returns for
 *   the same input (tests/test_h1_accel.py compares them on generated
 *   heads and headers).
 * - Nothing is kept between calls but http_date's value of the current
 *   second (formatted once a second, as the Python code does); the strings
 *   made at import (environ keys, versions) are constants.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <string.h>
#include <time.h>

#include "_module.h"
#include "_h1.h"

#if PY_VERSION_HEX < 0x030C0000
#include <structmember.h>
#define Py_T_OBJECT_EX T_OBJECT_EX
#endif

/* --- the request record ------------------------------------------------ */

/* forkserve.http.protocol.Request in C: the same fields, the same
 * constructor, made here by parse_head without a call into Python. */
#define REQUEST_FIELD(name, doc) \
    {#name, Py_T_OBJECT_EX, offsetof(RequestObject, name), 0, doc}

static PyMemberDef request_members[] = {
    REQUEST_FIELD(method, "the method, as sent"),
    REQUEST_FIELD(target, "the request target, as sent"),
    REQUEST_FIELD(version, "HTTP/1.0 or HTTP/1.1"),
    REQUEST_FIELD(line, "the request line as received, without CRLF (the access log's)"),
    REQUEST_FIELD(headers, "the fields keyed as the WSGI environ keys them (or the environ)"),
    REQUEST_FIELD(path, "the target's path (h1.request_target)"),
    REQUEST_FIELD(query, "the target's query"),
    REQUEST_FIELD(authority, "an absolute-form target's host, which replaces Host, or None"),
    REQUEST_FIELD(decoded, "True if `path` is already percent-decoded (a uwsgi PATH_INFO)"),
    REQUEST_FIELD(environ, "the whole WSGI environ if the parser made it, else None"),
    REQUEST_FIELD(chunked, "the body is chunked"),
    REQUEST_FIELD(length, "the Content-Length, 0 without a body, None if chunked"),
    REQUEST_FIELD(expect_continue, "the client waits for 100 Continue"),
    {NULL},
};


/* A new Request of these fields (each reference is taken, NULL ones are
 * None); NULL with an exception set. */
static PyObject *
request_new(PyObject *method, PyObject *target, PyObject *version, PyObject *line,
            PyObject *headers, PyObject *path, PyObject *query, PyObject *authority,
            PyObject *decoded, PyObject *environ)
{
    RequestObject *self = PyObject_GC_New(RequestObject, &H1_RequestType);
    if (self == NULL) {
        Py_XDECREF(method);
        Py_XDECREF(target);
        Py_XDECREF(version);
        Py_XDECREF(line);
        Py_XDECREF(headers);
        Py_XDECREF(path);
        Py_XDECREF(query);
        Py_XDECREF(authority);
        Py_XDECREF(decoded);
        Py_XDECREF(environ);
        return NULL;
    }
    self->method = method;
    self->target = target;
    self->version = version;
    self->line = line;
    self->headers = headers;
    self->path = path;
    self->query = query;
    self->authority = authority != NULL ? authority : Py_NewRef(Py_None);
    self->decoded = decoded != NULL ? decoded : Py_NewRef(Py_False);
    self->environ = environ != NULL ? environ : Py_NewRef(Py_None);
    self->chunked = Py_NewRef(Py_False);
    self->length = PyLong_FromLong(0);
    self->expect_continue = Py_NewRef(Py_False);
    PyObject_GC_Track(self);
    if (self->length == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static PyObject *
request_type_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *names[] = {"method", "target", "version", "line", "headers", "path", "query",
                            "authority", "decoded", "environ", NULL};
    PyObject *f[10] = {NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOOOO|OOO:Request", names, &f[0], &f[1],
                                     &f[2], &f[3], &f[4], &f[5], &f[6], &f[7], &f[8], &f[9])) {
        return NULL;
    }
    for (int i = 0; i < 10; i++) {
        Py_XINCREF(f[i]);
    }
    return request_new(f[0], f[1], f[2], f[3], f[4], f[5], f[6], f[7], f[8], f[9]);
}

static int
request_traverse(RequestObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->method);
    Py_VISIT(self->target);
    Py_VISIT(self->version);
    Py_VISIT(self->line);
    Py_VISIT(self->headers);
    Py_VISIT(self->path);
    Py_VISIT(self->query);
    Py_VISIT(self->authority);
    Py_VISIT(self->decoded);
    Py_VISIT(self->environ);
    Py_VISIT(self->chunked);
    Py_VISIT(self->length);
    Py_VISIT(self->expect_continue);
    return 0;
}

static int
request_clear(RequestObject *self)
{
    Py_CLEAR(self->method);
    Py_CLEAR(self->target);
    Py_CLEAR(self->version);
    Py_CLEAR(self->line);
    Py_CLEAR(self->headers);
    Py_CLEAR(self->path);
    Py_CLEAR(self->query);
    Py_CLEAR(self->authority);
    Py_CLEAR(self->decoded);
    Py_CLEAR(self->environ);
    Py_CLEAR(self->chunked);
    Py_CLEAR(self->length);
    Py_CLEAR(self->expect_continue);
    return 0;
}

static void
request_dealloc(RequestObject *self)
{
    PyObject_GC_UnTrack(self);
    request_clear(self);
    PyObject_GC_Del(self);
}

static PyObject *
request_repr(RequestObject *self)
{
    return PyUnicode_FromFormat("Request(%R, %R)", self->line ? self->line : Py_None,
                                self->headers ? self->headers : Py_None);
}

PyTypeObject H1_RequestType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "forkserve.http._h1.Request",
    .tp_doc = "A request head: forkserve.http.protocol.Request's fields, in C.",
    .tp_basicsize = sizeof(RequestObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = request_type_new,
    .tp_dealloc = (destructor)request_dealloc,
    .tp_traverse = (traverseproc)request_traverse,
    .tp_clear = (inquiry)request_clear,
    .tp_repr = (reprfunc)request_repr,
    .tp_members = request_members,
};

/* RFC 9110 tchar */
static unsigned char TCHAR[256];
/* a byte of a request target: visible ASCII */
static unsigned char VCHAR[256];
/* a byte of a field value: HTAB, SP, visible ASCII, obs-text */
static unsigned char FIELD[256];
/* a byte of a Host reg-name as forkserve.http.h1._HOST takes it: letters,
 * digits, "_" and .~%!$&'()*+,;= and "-" */
static unsigned char REGNAME[256];

static void
fill_tables(void)
{
    const char *marks = "!#$%&'*+-.^_`|~";
    for (int c = 0; c < 256; c++) {
        int alnum = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
        TCHAR[c] = alnum || (c && strchr(marks, c) != NULL);
        VCHAR[c] = c >= 0x21 && c <= 0x7e;
        FIELD[c] = c == '\t' || (c >= 0x20 && c <= 0x7e) || c >= 0x80;
        REGNAME[c] = alnum || (c && strchr("_.~%!$&'()*+,;=-", c) != NULL);
    }
}

/* case-insensitive equality of `n` bytes with a lower-case ASCII word of
 * `len` bytes */
static inline int
same_word(const unsigned char *s, Py_ssize_t n, const char *word, Py_ssize_t len)
{
    if (n != len) {
        return 0;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char c = s[i];
        if ((c >= 'A' && c <= 'Z' ? c + 32 : c) != (unsigned char)word[i]) {
            return 0;
        }
    }
    return 1;
}

#define is_word(s, n, word) same_word((s), (n), (word), (Py_ssize_t)sizeof(word) - 1)

PyObject *H1_HTTP10, *H1_HTTP11;          /* "HTTP/1.0", "HTTP/1.1" */
static PyObject *KEY_HOST, *KEY_CONNECTION;
/* the CGI keys of an environ made here, and SCRIPT_NAME */
static PyObject *KEY_REQUEST_METHOD, *KEY_SERVER_PROTOCOL, *KEY_RAW_URI, *KEY_REQUEST_URI,
    *KEY_PATH_INFO, *KEY_QUERY_STRING, *KEY_SCRIPT_NAME;

/* The environ keys of the fields clients send most, made once: a key made
 * per request would be a new string for the application to hash. */
static const char *const COMMON_KEYS[] = {
    "HTTP_HOST", "HTTP_USER_AGENT", "HTTP_ACCEPT", "HTTP_ACCEPT_ENCODING",
    "HTTP_ACCEPT_LANGUAGE", "HTTP_CONNECTION", "CONTENT_TYPE", "CONTENT_LENGTH",
    "HTTP_COOKIE", "HTTP_AUTHORIZATION", "HTTP_REFERER", "HTTP_ORIGIN",
    "HTTP_CACHE_CONTROL", "HTTP_PRAGMA", "HTTP_IF_NONE_MATCH", "HTTP_IF_MODIFIED_SINCE",
    "HTTP_RANGE", "HTTP_EXPECT", "HTTP_TRANSFER_ENCODING", "HTTP_UPGRADE_INSECURE_REQUESTS",
    "HTTP_X_FORWARDED_FOR", "HTTP_X_FORWARDED_PROTO", "HTTP_X_FORWARDED_HOST",
    "HTTP_X_REAL_IP", "HTTP_X_REQUEST_ID", "HTTP_SEC_FETCH_DEST", "HTTP_SEC_FETCH_MODE",
    "HTTP_SEC_FETCH_SITE", "HTTP_SEC_FETCH_USER", "HTTP_DNT", "HTTP_PRIORITY",
    "HTTP_KEEP_ALIVE", "HTTP_TE", "HTTP_UPGRADE",
};
#define N_COMMON (sizeof(COMMON_KEYS) / sizeof(COMMON_KEYS[0]))
static PyObject *common_keys[N_COMMON];
static Py_ssize_t common_lengths[N_COMMON];
static PyObject *key_transfer_encoding;

#define KEY_MAX 256  /* a longer field name gets a key made for it */

/* The environ key of a field name (PEP 3333: HTTP_ and the name upper-cased
 * with "-" as "_"; Content-Type and Content-Length without HTTP_); a new
 * reference, or NULL with an exception set. */
static PyObject *
environ_key(const unsigned char *name, Py_ssize_t n)
{
    char key[KEY_MAX + 6];
    Py_ssize_t k = 0;
    if (n <= KEY_MAX) {
        int content = is_word(name, n, "content-type") || is_word(name, n, "content-length");
        if (!content) {
            memcpy(key, "HTTP_", 5);
            k = 5;
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            unsigned char c = name[i];
            key[k++] = c == '-' ? '_' : (c >= 'a' && c <= 'z') ? (char)(c - 32) : (char)c;
        }
        for (size_t i = 0; i < N_COMMON; i++) {
            const char *common = COMMON_KEYS[i];
            if (common_lengths[i] == k && memcmp(common, key, k) == 0) {
                return Py_NewRef(common_keys[i]);
            }
        }
        return PyUnicode_DecodeASCII(key, k, NULL);
    }
    PyObject *name_str = PyUnicode_DecodeASCII((const char *)name, n, NULL);
    if (name_str == NULL) {
        return NULL;
    }
    PyObject *upper = PyObject_CallMethod(name_str, "upper", NULL);
    Py_DECREF(name_str);
    if (upper == NULL) {
        return NULL;
    }
    PyObject *under = PyObject_CallMethod(upper, "replace", "ss", "-", "_");
    Py_DECREF(upper);
    if (under == NULL) {
        return NULL;
    }
    PyObject *result = PyUnicode_FromFormat("HTTP_%U", under);
    Py_DECREF(under);
    return result;
}

static PyObject *
latin1(const unsigned char *start, Py_ssize_t n)
{
    return PyUnicode_DecodeLatin1((const char *)start, n, NULL);
}



/* A Host value forkserve.http.h1._HOST accepts through its reg-name
 * branch, with an optional port; 0 for anything else (an IP literal, a
 * byte outside it), which the Python code then decides. */
static int
usual_host(const unsigned char *s, Py_ssize_t n)
{
    Py_ssize_t i = 0;
    while (i < n && REGNAME[s[i]]) {
        i++;
    }
    if (i < n && s[i] == ':') {
        for (i++; i < n && s[i] >= '0' && s[i] <= '9'; i++) {
        }
    }
    return i == n;
}

static int
hex_digit(unsigned char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* PATH_INFO: the path percent-decoded as forkserve.http.environ decodes it
 * (urllib.parse.unquote(path, "latin-1"): "%" and two hex digits is that
 * byte, any other "%" stays); a new reference, or NULL with an exception */
static PyObject *
path_info(PyObject *path_s, const unsigned char *path, Py_ssize_t n)
{
    if (memchr(path, '%', n) == NULL) {
        return Py_NewRef(path_s);
    }
    PyObject *decoded = PyBytes_FromStringAndSize(NULL, n);
    if (decoded == NULL) {
        return NULL;
    }
    unsigned char *out = (unsigned char *)PyBytes_AS_STRING(decoded);
    Py_ssize_t k = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        int high, low;
        if (path[i] == '%' && i + 2 < n
                && (high = hex_digit(path[i + 1])) >= 0 && (low = hex_digit(path[i + 2])) >= 0) {
            out[k++] = (unsigned char)(high * 16 + low);
            i += 2;
        }
        else {
            out[k++] = path[i];
        }
    }
    PyObject *result = latin1(out, k);
    Py_DECREF(decoded);
    return result;
}

/* The WSGI environ of a request in its usual form, as
 * forkserve.http.environ.request_environ makes it from `base` (whose
 * SCRIPT_NAME is empty): a copy of `base`, the header keys and the CGI
 * keys. `headers` is taken (its reference is released), as are the other
 * strings given; NULL with an exception set on failure. */
static PyObject *
request_environ(PyObject *base, PyObject *headers, PyObject *method, PyObject *version,
                PyObject *target, PyObject *path_s, const unsigned char *path,
                Py_ssize_t path_n, PyObject *query)
{
    PyObject *env = PyDict_Copy(base);
    PyObject *info = env == NULL ? NULL : path_info(path_s, path, path_n);
    int failed = info == NULL || PyDict_Update(env, headers) < 0
        || PyDict_SetItem(env, KEY_REQUEST_METHOD, method) < 0
        || PyDict_SetItem(env, KEY_SERVER_PROTOCOL, version) < 0
        || PyDict_SetItem(env, KEY_RAW_URI, target) < 0
        || PyDict_SetItem(env, KEY_REQUEST_URI, target) < 0
        || PyDict_SetItem(env, KEY_PATH_INFO, info) < 0
        || PyDict_SetItem(env, KEY_QUERY_STRING, query) < 0;
    Py_XDECREF(info);
    Py_DECREF(headers);
    if (failed) {
        Py_XDECREF(env);
        return NULL;
    }
    return env;
}

PyObject *
h1_parse_head(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 4 || nargs > 5 || !PyBytes_CheckExact(args[0])
            || (nargs == 5 && args[4] != Py_None && !PyDict_CheckExact(args[4]))) {
        PyErr_SetString(PyExc_TypeError,
                        "parse_head(buf: bytes, pos, window, fields_max, base: dict | None = None)");
        return NULL;
    }
    PyObject *base = nargs == 5 && args[4] != Py_None ? args[4] : NULL;
    if (base != NULL) {
        PyObject *script_name = PyDict_GetItemWithError(base, KEY_SCRIPT_NAME);
        if (script_name == NULL || !PyUnicode_CheckExact(script_name)
                || PyUnicode_GET_LENGTH(script_name) != 0) {
            if (!PyErr_Occurred()) {
                PyErr_SetString(PyExc_ValueError, "parse_head: base must have an empty "
                                                  "SCRIPT_NAME (a prefix is the Python code's)");
            }
            return NULL;
        }
    }
    Py_ssize_t size = PyBytes_GET_SIZE(args[0]);
    Py_ssize_t pos = PyLong_AsSsize_t(args[1]);
    Py_ssize_t window = PyLong_AsSsize_t(args[2]);
    Py_ssize_t fields_max = PyLong_AsSsize_t(args[3]);
    if (PyErr_Occurred()) {
        return NULL;
    }
    if (pos < 0 || pos > size || window < 0) {
        PyErr_SetString(PyExc_ValueError, "parse_head: position out of range");
        return NULL;
    }
    const unsigned char *buf = (const unsigned char *)PyBytes_AS_STRING(args[0]);
    /* buf.find(b"\r\n\r\n", pos, pos + window), as Connection._next_head asks */
    Py_ssize_t stop = size - pos < window ? size : pos + window;
    const unsigned char *p = buf + pos, *end = NULL;
    while (stop - (p - buf) >= 4) {
        const unsigned char *cr = memchr(p, '\r', stop - (p - buf) - 3);
        if (cr == NULL) {
            break;
        }
        if (cr[1] == '\n' && cr[2] == '\r' && cr[3] == '\n') {
            end = cr + 2;  /* the end of the last line's CRLF */
            break;
        }
        p = cr + 1;
    }
    if (end == NULL) {
        Py_RETURN_NONE;
    }

    /* the request line: tchar+ SP vchar+ SP "HTTP/1." DIGIT CRLF */
    const unsigned char *s = buf + pos, *method = s;
    while (s < end && TCHAR[*s]) {
        s++;
    }
    Py_ssize_t method_n = s - method;
    if (!method_n || s >= end || *s != ' ') {
        Py_RETURN_NONE;
    }
    const unsigned char *target = ++s;
    while (s < end && VCHAR[*s]) {
        s++;
    }
    Py_ssize_t target_n = s - target;
    if (!target_n || end - s < 11 || memcmp(s, " HTTP/1.", 8) != 0
            || s[8] < '0' || s[8] > '9' || s[9] != '\r' || s[10] != '\n') {
        Py_RETURN_NONE;
    }
    int http10 = s[8] == '0';
    Py_ssize_t line_n = s + 9 - method;
    s += 11;
    /* what the Python code refuses or treats apart: a fragment, CONNECT,
     * a target that is not a path (absolute form, *) */
    if (target[0] != '/' || memchr(target, '#', target_n) != NULL
            || (method_n == 7 && memcmp(method, "CONNECT", 7) == 0)) {
        Py_RETURN_NONE;
    }

    PyObject *headers = PyDict_New();
    if (headers == NULL) {
        return NULL;
    }
    Py_ssize_t fields = 0;
    int keep = !http10, have_host = 0;
    while (s < end) {  /* field lines: tchar+ ":" field-value CRLF */
        const unsigned char *name = s;
        while (s < end && TCHAR[*s]) {
            s++;
        }
        Py_ssize_t name_n = s - name;
        if (!name_n || s >= end || *s != ':') {
            goto decline;
        }
        const unsigned char *value = ++s;
        while (s < end && FIELD[*s]) {
            s++;
        }
        if (end - s < 2 || s[0] != '\r' || s[1] != '\n') {
            goto decline;
        }
        const unsigned char *value_end = s;
        s += 2;
        if (++fields > fields_max) {
            goto decline;
        }
        if (memchr(name, '_', name_n) != NULL) {
            continue;  /* dropped, as the Python code drops it */
        }
        while (value < value_end && (*value == ' ' || *value == '\t')) {
            value++;
        }
        while (value_end > value && (value_end[-1] == ' ' || value_end[-1] == '\t')) {
            value_end--;
        }
        Py_ssize_t value_n = value_end - value;
        PyObject *key = environ_key(name, name_n);
        if (key == NULL) {
            goto error;
        }
        int seen = PyDict_Contains(headers, key);
        if (seen != 0) {
            Py_DECREF(key);
            if (seen < 0) {
                goto error;
            }
            goto decline;  /* a repeated field: the Python code joins or refuses it */
        }
        if (key == key_transfer_encoding) {
            Py_DECREF(key);
            goto decline;  /* a chunked body: framed by the Python code */
        }
        if (key == KEY_HOST) {
            if (!usual_host(value, value_n)) {
                Py_DECREF(key);
                goto decline;
            }
            have_host = 1;
        }
        else if (key == KEY_CONNECTION) {
            if (is_word(value, value_n, "close")) {
                keep = 0;
            }
            else if (is_word(value, value_n, "keep-alive")) {
                keep = 1;
            }
            else {
                Py_DECREF(key);
                goto decline;  /* a list of tokens */
            }
        }
        PyObject *text = latin1(value, value_n);
        if (text == NULL) {
            Py_DECREF(key);
            goto error;
        }
        int failed = PyDict_SetItem(headers, key, text);
        Py_DECREF(key);
        Py_DECREF(text);
        if (failed) {
            goto error;
        }
    }
    if (!have_host && !http10) {
        goto decline;  /* HTTP/1.1 without Host: refused by the Python code */
    }

    PyObject *method_s = latin1(method, method_n);
    PyObject *target_s = latin1(target, target_n);
    PyObject *line_s = latin1(method, line_n);
    const unsigned char *question = memchr(target, '?', target_n);
    Py_ssize_t path_n = question == NULL ? target_n : question - target;
    PyObject *path_s = question == NULL ? Py_XNewRef(target_s) : latin1(target, path_n);
    PyObject *query_s = question == NULL ? PyUnicode_New(0, 0)
                                         : latin1(question + 1, target_n - path_n - 1);
    PyObject *end_o = PyLong_FromSsize_t(end + 2 - buf);
    PyObject *environ = NULL;
    if (!(method_s && target_s && line_s && path_s && query_s && end_o)) {
        goto failed;
    }
    if (base != NULL) {  /* the headers become the whole environ */
        headers = request_environ(base, headers, method_s, http10 ? H1_HTTP10 : H1_HTTP11, target_s,
                                  path_s, target, path_n, query_s);
        if (headers == NULL) {
            goto failed;
        }
        environ = Py_NewRef(headers);
    }
    /* the request takes each reference */
    PyObject *request = request_new(method_s, target_s, Py_NewRef(http10 ? H1_HTTP10 : H1_HTTP11),
                                    line_s, headers, path_s, query_s, NULL, NULL, environ);
    PyObject *result = request == NULL ? NULL : PyTuple_New(3);
    if (result == NULL) {
        Py_XDECREF(request);
        Py_DECREF(end_o);
        return NULL;
    }
    PyTuple_SET_ITEM(result, 0, end_o);
    PyTuple_SET_ITEM(result, 1, request);
    PyTuple_SET_ITEM(result, 2, Py_NewRef(keep ? Py_True : Py_False));
    return result;

failed:
    Py_XDECREF(end_o);
    Py_XDECREF(method_s);
    Py_XDECREF(target_s);
    Py_XDECREF(line_s);
    Py_XDECREF(path_s);
    Py_XDECREF(query_s);
    Py_XDECREF(headers);
    return NULL;

decline:
    Py_DECREF(headers);
    Py_RETURN_NONE;
error:
    Py_DECREF(headers);
    return NULL;
}

/* --- the response head ------------------------------------------------- */

typedef struct {
    char *data;
    Py_ssize_t size, cap;
    char small[1024];
} Out;

static int
out_put(Out *out, const void *bytes, Py_ssize_t n)
{
    if (out->size + n > out->cap) {
        Py_ssize_t cap = (out->cap + n) * 2;
        char *bigger = out->data == out->small ? PyMem_Malloc(cap) : PyMem_Realloc(out->data, cap);
        if (bigger == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        if (out->data == out->small) {
            memcpy(bigger, out->small, out->size);
        }
        out->data = bigger;
        out->cap = cap;
    }
    memcpy(out->data + out->size, bytes, n);
    out->size += n;
    return 0;
}

static void
out_free(Out *out)
{
    if (out->data != out->small) {
        PyMem_Free(out->data);
    }
}

/* a str of latin-1 characters as its bytes, or NULL (no exception) */
static const unsigned char *
latin1_bytes(PyObject *text, Py_ssize_t *n)
{
    if (!PyUnicode_CheckExact(text) || PyUnicode_KIND(text) != PyUnicode_1BYTE_KIND) {
        return NULL;
    }
    *n = PyUnicode_GET_LENGTH(text);
    return PyUnicode_1BYTE_DATA(text);
}

/* does the lower-cased `s` contain "close" (the Python code's
 * `"close" in value.lower()`)? */
static int
mentions_close(const unsigned char *s, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i + 5 <= n; i++) {
        if (strncasecmp((const char *)s + i, "close", 5) == 0) {
            return 1;
        }
    }
    return 0;
}

PyObject *
h1_build_head(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "build_head(status, headers, total, chunk_ok, "
                                         "http10, head_request, keep, date)");
        return NULL;
    }
    PyObject *status = args[0], *headers = args[1], *total_o = args[2], *date = args[7];
    int chunk_ok = PyObject_IsTrue(args[3]), http10 = PyObject_IsTrue(args[4]);
    int head_request = PyObject_IsTrue(args[5]), keep = PyObject_IsTrue(args[6]);
    if (chunk_ok < 0 || http10 < 0 || head_request < 0 || keep < 0) {
        return NULL;
    }
    Py_ssize_t status_n = 0, date_n = 0;
    const unsigned char *status_s = latin1_bytes(status, &status_n);
    const unsigned char *date_s = date == Py_None ? NULL : latin1_bytes(date, &date_n);
    if (status_s == NULL || status_n < 4 || !PyList_CheckExact(headers)
            || (date != Py_None && date_s == NULL)) {
        Py_RETURN_NONE;
    }
    int code = 0;
    for (int i = 0; i < 3; i++) {
        if (status_s[i] < '0' || status_s[i] > '9') {
            Py_RETURN_NONE;
        }
        code = code * 10 + (status_s[i] - '0');
    }
    if (code < 200 || status_s[3] != ' ') {
        Py_RETURN_NONE;  /* 1xx, or a status the Python code checks itself */
    }
    for (Py_ssize_t i = 4; i < status_n; i++) {
        if (status_s[i] < 0x20 || status_s[i] >= 0x7f) {
            Py_RETURN_NONE;
        }
    }
    Py_ssize_t total = -1;
    if (total_o != Py_None) {
        total = PyLong_AsSsize_t(total_o);
        if (total < 0) {
            PyErr_Clear();
            Py_RETURN_NONE;
        }
    }

    Out out;  /* `small` is left as it is: only what out_put writes is read */
    out.data = out.small;
    out.size = 0;
    out.cap = sizeof(out.small);
    long long length = -1;
    int close = 0, dated = 0;
    if (out_put(&out, "HTTP/1.1 ", 9) < 0 || out_put(&out, status_s, status_n) < 0
            || out_put(&out, "\r\n", 2) < 0) {
        goto error;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(headers); i++) {
        PyObject *pair = PyList_GET_ITEM(headers, i);
        if (!PyTuple_CheckExact(pair) || PyTuple_GET_SIZE(pair) != 2) {
            goto decline;
        }
        Py_ssize_t name_n = 0, value_n = 0;
        const unsigned char *name = latin1_bytes(PyTuple_GET_ITEM(pair, 0), &name_n);
        const unsigned char *value = latin1_bytes(PyTuple_GET_ITEM(pair, 1), &value_n);
        if (name == NULL || value == NULL || !name_n) {
            goto decline;
        }
        for (Py_ssize_t j = 0; j < name_n; j++) {
            if (!TCHAR[name[j]]) {
                goto decline;
            }
        }
        for (Py_ssize_t j = 0; j < value_n; j++) {
            if (!FIELD[value[j]]) {
                goto decline;
            }
        }
        if (is_word(name, name_n, "content-length")) {
            if (length >= 0 || value_n == 0 || value_n > 18) {
                goto decline;
            }
            long long n = 0;
            for (Py_ssize_t j = 0; j < value_n; j++) {
                if (value[j] < '0' || value[j] > '9') {
                    goto decline;
                }
                n = n * 10 + (value[j] - '0');
            }
            length = n;
            if (code == 204) {
                continue;
            }
        }
        else if (is_word(name, name_n, "date")) {
            dated = 1;
        }
        else if (is_word(name, name_n, "connection")) {
            close = close || mentions_close(value, value_n);
            continue;
        }
        else if (is_word(name, name_n, "transfer-encoding")) {
            continue;
        }
        if (out_put(&out, name, name_n) < 0 || out_put(&out, ": ", 2) < 0
                || out_put(&out, value, value_n) < 0 || out_put(&out, "\r\n", 2) < 0) {
            goto error;
        }
    }
    int bodiless = code == 204 || code == 304;
    int no_body = head_request || bodiless;
    long long declared = -1;
    int chunked = 0;
    if (bodiless) {
        /* never a body, never framing of our own */
    }
    else if (length >= 0) {
        declared = no_body ? -1 : length;
    }
    else if (total >= 0) {
        /* the name, a Py_ssize_t's 19 digits at most, CRLF and the NUL: 38 */
        char number[sizeof("Content-Length: \r\n") + 20];
        int n = snprintf(number, sizeof(number), "Content-Length: %zd\r\n", total);
        if (n < 0 || (size_t)n >= sizeof(number)) {
            goto decline;  /* cut short: never here, and the Python code writes it whole */
        }
        if (out_put(&out, number, n) < 0) {
            goto error;
        }
    }
    else if (chunk_ok) {
        if (out_put(&out, "Transfer-Encoding: chunked\r\n", 28) < 0) {
            goto error;
        }
        chunked = !no_body;
    }
    else if (!no_body) {
        close = 1;
    }
    keep = keep && !close;
    if (!keep) {
        if (out_put(&out, "Connection: close\r\n", 19) < 0) {
            goto error;
        }
    }
    else if (http10 && out_put(&out, "Connection: keep-alive\r\n", 24) < 0) {
        goto error;
    }
    if (!dated && date_s != NULL) {
        if (out_put(&out, "Date: ", 6) < 0 || out_put(&out, date_s, date_n) < 0
                || out_put(&out, "\r\n", 2) < 0) {
            goto error;
        }
    }
    if (out_put(&out, "\r\n", 2) < 0) {
        goto error;
    }
    PyObject *head = PyBytes_FromStringAndSize(out.data, out.size);
    out_free(&out);
    if (head == NULL) {
        return NULL;
    }
    PyObject *declared_o = declared < 0 ? Py_NewRef(Py_None) : PyLong_FromLongLong(declared);
    PyObject *code_o = PyLong_FromLong(code);
    PyObject *result = declared_o && code_o ? PyTuple_New(5) : NULL;
    if (result == NULL) {
        Py_DECREF(head);
        Py_XDECREF(declared_o);
        Py_XDECREF(code_o);
        return NULL;
    }
    PyTuple_SET_ITEM(result, 0, code_o);
    PyTuple_SET_ITEM(result, 1, head);
    PyTuple_SET_ITEM(result, 2, declared_o);
    PyTuple_SET_ITEM(result, 3, Py_NewRef(chunked ? Py_True : Py_False));
    PyTuple_SET_ITEM(result, 4, Py_NewRef(keep ? Py_True : Py_False));
    return result;

decline:
    out_free(&out);
    Py_RETURN_NONE;
error:
    out_free(&out);
    return NULL;
}

/* http_date(): the Date header's value for now (RFC 9110 5.6.7), made at
 * most once a second, as email.utils.formatdate(usegmt=True) makes it. */
static PyObject *
http_date(PyObject *module, PyObject *unused)
{
    static time_t made_at = (time_t)-1;
    static PyObject *made = NULL;
    static const char days[7][4] = {"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"};
    static const char months[12][4] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug",
                                       "Sep", "Oct", "Nov", "Dec"};
    time_t now = time(NULL);
    if (now != made_at || made == NULL) {
        struct tm tm;
        if (gmtime_r(&now, &tm) == NULL) {
            return PyErr_SetFromErrno(PyExc_OSError);
        }
        char text[64];
        snprintf(text, sizeof text, "%s, %02d %s %04d %02d:%02d:%02d GMT", days[tm.tm_wday],
                 tm.tm_mday, months[tm.tm_mon], tm.tm_year + 1900, tm.tm_hour, tm.tm_min,
                 tm.tm_sec);
        PyObject *fresh = PyUnicode_FromString(text);
        if (fresh == NULL) {
            return NULL;
        }
        Py_XSETREF(made, fresh);
        made_at = now;
    }
    return Py_NewRef(made);
}

static PyMethodDef methods[] = {
    {"http_date", http_date, METH_NOARGS,
     "http_date(): the Date header's value for now, made at most once a second"},
    {"parse_head", (PyCFunction)(void (*)(void))h1_parse_head, METH_FASTCALL,
     "parse_head(buf, pos, window, fields_max): the usual request head, or None"},
    {"build_head", (PyCFunction)(void (*)(void))h1_build_head, METH_FASTCALL,
     "build_head(status, headers, total, chunk_ok, http10, head_request, keep, date): "
     "the usual response head, or None"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = MODULE_DEF(
    "forkserve.http._h1",
    "The usual request head in and response head out, and the connection's "
    "per-request steps, in C (forkserve.cext says when they are used).",
    methods);

static int
fill(PyObject *module)
{
    fill_tables();
    if (PyType_Ready(&H1_RequestType) < 0
            || PyModule_AddObjectRef(module, "Request", (PyObject *)&H1_RequestType) < 0) {
        return -1;
    }
    H1_HTTP10 = PyUnicode_InternFromString("HTTP/1.0");
    H1_HTTP11 = PyUnicode_InternFromString("HTTP/1.1");
    if (H1_HTTP10 == NULL || H1_HTTP11 == NULL) {
        return -1;
    }
    for (size_t i = 0; i < N_COMMON; i++) {
        common_lengths[i] = (Py_ssize_t)strlen(COMMON_KEYS[i]);
        common_keys[i] = PyUnicode_InternFromString(COMMON_KEYS[i]);
        if (common_keys[i] == NULL) {
            return -1;
        }
    }
    PyObject **cgi[] = {&KEY_REQUEST_METHOD, &KEY_SERVER_PROTOCOL, &KEY_RAW_URI,
                        &KEY_REQUEST_URI, &KEY_PATH_INFO, &KEY_QUERY_STRING, &KEY_SCRIPT_NAME};
    const char *cgi_names[] = {"REQUEST_METHOD", "SERVER_PROTOCOL", "RAW_URI", "REQUEST_URI",
                               "PATH_INFO", "QUERY_STRING", "SCRIPT_NAME"};
    for (size_t i = 0; i < sizeof(cgi) / sizeof(cgi[0]); i++) {
        *cgi[i] = PyUnicode_InternFromString(cgi_names[i]);
        if (*cgi[i] == NULL) {
            return -1;
        }
    }
    if (h1_connection_add(module) < 0) {
        return -1;
    }
    KEY_HOST = common_keys[0];
    KEY_CONNECTION = common_keys[5];
    key_transfer_encoding = common_keys[18];
    return 0;
}

PyMODINIT_FUNC
PyInit__h1(void)
{
    return module_create(&module_def, fill);
}
