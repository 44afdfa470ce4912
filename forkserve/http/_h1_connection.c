/* forkserve/http/_h1_connection.c: forkserve.http.protocol's ConnectionBase
 * in C, the connection object's state and the steps every request on a
 * kept connection takes, so that a request that needs nothing unusual is
 * received, answered and followed by the next without a call into Python.
 *
 *   receive_data(data), buffered, start_next_cycle()
 *       all of them (protocol.PythonConnectionBase is the same in Python).
 *   next_event(max_bytes=None)
 *       a head arriving on an idle connection, parsed by parse_head (_h1.c)
 *       and, without a body, settled here as Connection._framed settles it;
 *       with a body, _framed itself frames it. Anything else, and a head
 *       parse_head declines, is Connection._next_event's.
 *   whole_response(status, headers, body, date)
 *       the response build_head (_h1.c) makes, settled as
 *       Connection._whole_response settles it; what it declines, and
 *       everything while the `_c_build` switch is off, is that method's.
 *
 * Invariants:
 * - The state lives in this struct only; the Python subclass (Connection)
 *   reads and writes it as attributes of the same names (`their_state`,
 *   `_buf`, `keep_alive`...), so its code does not know which base it has.
 * - Where this code takes a step, the result and every attribute it sets
 *   are the ones the Python code sets for the same input
 *   (tests/test_h1_accel.py runs both on generated requests); where it does
 *   not, it hands the same call to the Python code before changing
 *   anything that code reads, except `their_state` = HEAD, which that code
 *   sets first too.
 * - The switches `_c_parse` and `_c_build` (set by Connection.__init__
 *   from its _fast_parse and _fast_build) turn the C steps off: the Python
 *   code then does all of it, as where this module is not built.
 */
#include "_h1.h"

#include <stddef.h>

#if PY_VERSION_HEX < 0x030C0000
#include <structmember.h>
#define Py_T_OBJECT_EX T_OBJECT_EX
#define Py_T_PYSSIZET T_PYSSIZET
#define Py_T_BOOL T_BOOL
#endif

/* The states of protocol's module docstring, the same objects there. */
static PyObject *IDLE, *HEAD, *BODY, *DONE, *ERROR, *CLOSED, *SEND_BODY;
static PyObject *KEY_CONTENT_LENGTH;
static PyObject *REQUEST_ERROR;  /* forkserve.http.h1.RequestError */
static PyObject *NAME_NEXT_EVENT, *NAME_WHOLE_RESPONSE, *NAME_FRAMED, *NAME_RESPONSE_DATA,
    *NAME_RESPONSE_END;

typedef struct {
    PyObject_HEAD
    PyObject *buf;                  /* _buf: bytes received (from _pos on: not consumed) */
    Py_ssize_t pos;                 /* _pos */
    Py_ssize_t left;                /* _left: body bytes left (of the chunk, if chunked) */
    PyObject *eof;                  /* _eof: the client closed its side */
    PyObject *their_state, *our_state;
    PyObject *request;
    PyObject *keep_alive, *keep_alive_allowed, *draining, *body_error;
    PyObject *no_body;              /* _no_body: HEAD, 204, 304 */
    PyObject *declared;             /* _declared: bytes the response's Content-Length expects */
    PyObject *chunked;              /* _chunked: the response body is chunked */
    PyObject *cont;                 /* _continue: a 100 Continue is owed */
    PyObject *code;
    Py_ssize_t sent;
    PyObject *lines;                /* _lines: a head read line by line */
    PyObject *response_problem;
    PyObject *environ_base;
    Py_ssize_t head_max, fields_max;
    char c_parse, c_build, chunk_responses;
} ConnectionObject;

static inline int
truth(PyObject *o)
{
    return o == Py_True ? 1 : (o == Py_False || o == Py_None) ? 0 : PyObject_IsTrue(o);
}

#define SET(field, value) Py_XSETREF(self->field, Py_NewRef(value))

/* --- bytes in --------------------------------------------------------- */

/* _buf is bytes: receive_data makes it so, and nothing else sets it. */
static PyObject *
buffer_not_bytes(void)
{
    PyErr_SetString(PyExc_TypeError, "Connection._buf must be bytes");
    return NULL;
}

static PyObject *
receive_data(ConnectionObject *self, PyObject *data)
{
    PyObject *bytes = PyBytes_CheckExact(data) ? Py_NewRef(data) : PyBytes_FromObject(data);
    if (bytes == NULL) {
        return NULL;
    }
    if (!PyBytes_CheckExact(self->buf)) {
        Py_DECREF(bytes);
        return buffer_not_bytes();
    }
    Py_ssize_t n = PyBytes_GET_SIZE(bytes);
    if (n == 0) {
        Py_DECREF(bytes);
        SET(eof, Py_True);
        Py_RETURN_NONE;
    }
    Py_ssize_t size = PyBytes_GET_SIZE(self->buf), pos = self->pos;
    if (pos < size) {
        /* held: the allocation can run a finaliser that replaces _buf */
        PyObject *buf = Py_NewRef(self->buf);
        PyObject *joined = PyBytes_FromStringAndSize(NULL, size - pos + n);
        if (joined == NULL) {
            Py_DECREF(buf);
            Py_DECREF(bytes);
            return NULL;
        }
        memcpy(PyBytes_AS_STRING(joined), PyBytes_AS_STRING(buf) + pos, size - pos);
        memcpy(PyBytes_AS_STRING(joined) + size - pos, PyBytes_AS_STRING(bytes), n);
        Py_DECREF(buf);
        Py_DECREF(bytes);
        bytes = joined;
    }
    Py_XSETREF(self->buf, bytes);
    self->pos = 0;
    Py_RETURN_NONE;
}

static PyObject *
get_buffered(ConnectionObject *self, void *unused)
{
    if (!PyBytes_CheckExact(self->buf)) {
        return buffer_not_bytes();
    }
    return PyLong_FromSsize_t(PyBytes_GET_SIZE(self->buf) - self->pos);
}

/* A RequestError from the Python code puts the connection in ERROR, as
 * Connection._next_event does for its own. */
static void
refused(ConnectionObject *self)
{
    if (PyErr_ExceptionMatches(REQUEST_ERROR)) {
        SET(their_state, ERROR);
        SET(keep_alive, Py_False);
    }
}

static PyObject *
next_event(ConnectionObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs > 1) {
        PyErr_SetString(PyExc_TypeError, "next_event(max_bytes=None)");
        return NULL;
    }
    PyObject *max_bytes = nargs ? args[0] : Py_None;
    if (!self->c_parse || self->their_state != IDLE || self->lines != Py_None
            || !PyBytes_CheckExact(self->buf) || self->pos >= PyBytes_GET_SIZE(self->buf)) {
        goto python;
    }
    /* held: the old state's release below, and any allocation (a
     * collection's finaliser), can run Python that replaces either field */
    PyObject *buf = Py_NewRef(self->buf), *environ_base = Py_NewRef(self->environ_base);
    PyObject *pos = PyLong_FromSsize_t(self->pos);
    SET(their_state, HEAD);
    PyObject *window = PyLong_FromSsize_t(self->head_max);
    PyObject *fields_max = PyLong_FromSsize_t(self->fields_max);
    PyObject *head = NULL;
    if (pos != NULL && window != NULL && fields_max != NULL) {
        PyObject *parse_args[5] = {buf, pos, window, fields_max, environ_base};
        head = h1_parse_head(NULL, parse_args, 5);
    }
    Py_DECREF(buf);
    Py_DECREF(environ_base);
    Py_XDECREF(pos);
    Py_XDECREF(window);
    Py_XDECREF(fields_max);
    if (head == NULL) {
        return NULL;
    }
    if (head == Py_None) {
        Py_DECREF(head);
        goto python;
    }
    Py_ssize_t end = PyLong_AsSsize_t(PyTuple_GET_ITEM(head, 0));
    PyObject *request = PyTuple_GET_ITEM(head, 1), *keep = PyTuple_GET_ITEM(head, 2);
    self->pos = end;
    RequestObject *r = (RequestObject *)request;
    PyObject *length = PyDict_GetItemWithError(r->headers, KEY_CONTENT_LENGTH);
    if (length == NULL && PyErr_Occurred()) {
        Py_DECREF(head);
        return NULL;
    }
    if (length != NULL) {  /* a body (parse_head declines Transfer-Encoding): _framed's */
        PyObject *lengths = PyList_New(1);
        PyObject *framed = NULL;
        if (lengths != NULL) {
            PyList_SET_ITEM(lengths, 0, Py_NewRef(length));
            PyObject *call[4] = {(PyObject *)self, request, lengths, keep};
            framed = PyObject_VectorcallMethod(NAME_FRAMED, call,
                                               4 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
            Py_DECREF(lengths);
        }
        Py_DECREF(head);
        if (framed == NULL) {
            refused(self);
        }
        return framed;
    }
    /* no body: the usual request (Connection._framed's first branch) */
    int allowed = truth(self->keep_alive_allowed);
    if (allowed < 0) {
        Py_DECREF(head);
        return NULL;
    }
    SET(keep_alive, keep == Py_True && allowed ? Py_True : Py_False);
    SET(no_body, PyUnicode_CompareWithASCIIString(r->method, "HEAD") == 0 ? Py_True : Py_False);
    SET(request, request);
    SET(their_state, DONE);
    SET(cont, Py_False);
    Py_INCREF(request);
    Py_DECREF(head);
    return request;

python:;
    PyObject *call[2] = {(PyObject *)self, max_bytes};
    return PyObject_VectorcallMethod(NAME_NEXT_EVENT, call, 2 | PY_VECTORCALL_ARGUMENTS_OFFSET,
                                     NULL);
}

/* --- bytes out -------------------------------------------------------- */

static PyObject *
python_whole_response(ConnectionObject *self, PyObject *const *args)
{
    PyObject *call[5] = {(PyObject *)self, args[0], args[1], args[2], args[3]};
    return PyObject_VectorcallMethod(NAME_WHOLE_RESPONSE, call,
                                     5 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
}

static PyObject *
whole_response(ConnectionObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "whole_response(status, headers, body, date)");
        return NULL;
    }
    int draining = truth(self->draining);
    if (draining < 0) {
        return NULL;
    }
    if (self->their_state != DONE || draining) {
        Py_RETURN_NONE;  /* as _whole_response: the driver takes the steps one by one */
    }
    PyObject *body = args[2];
    PyObject *version = Py_IS_TYPE(self->request, &H1_RequestType)
        ? ((RequestObject *)self->request)->version : NULL;
    if (!self->c_build || !PyBytes_CheckExact(body) || version == NULL
            || !PyUnicode_Check(version)) {
        return python_whole_response(self, args);
    }
    /* parse_head's versions are these two objects; the Python code's are equal strings */
    int http11 = version == H1_HTTP11
        || (version != H1_HTTP10 && PyUnicode_CompareWithASCIIString(version, "HTTP/1.1") == 0);
    int http10 = !http11 && (version == H1_HTTP10
                             || PyUnicode_CompareWithASCIIString(version, "HTTP/1.0") == 0);
    Py_ssize_t size = PyBytes_GET_SIZE(body);
    PyObject *total = PyLong_FromSsize_t(size);
    if (total == NULL) {
        return NULL;
    }
    /* held: build_head's truth tests can run Python that replaces either field */
    PyObject *held_no_body = Py_NewRef(self->no_body), *held_keep = Py_NewRef(self->keep_alive);
    PyObject *build_args[8] = {args[0], args[1], total,
                               self->chunk_responses && http11 ? Py_True : Py_False,
                               http10 ? Py_True : Py_False, held_no_body, held_keep, args[3]};
    PyObject *built = h1_build_head(NULL, build_args, 8);
    Py_DECREF(held_no_body);
    Py_DECREF(held_keep);
    Py_DECREF(total);
    if (built == NULL) {
        return NULL;
    }
    if (built == Py_None) {
        Py_DECREF(built);
        return python_whole_response(self, args);
    }
    /* code, head, declared, chunked, keep: as Connection._head takes them */
    PyObject *code = PyTuple_GET_ITEM(built, 0), *head = PyTuple_GET_ITEM(built, 1);
    PyObject *declared = PyTuple_GET_ITEM(built, 2);
    SET(declared, declared);
    SET(chunked, PyTuple_GET_ITEM(built, 3));
    SET(keep_alive, PyTuple_GET_ITEM(built, 4));
    long status = PyLong_AsLong(code);
    if (status == 204 || status == 304) {
        SET(no_body, Py_True);
    }
    SET(code, code);
    PyObject *result;
    int no_body = truth(self->no_body);
    if (no_body < 0) {
        result = NULL;
    }
    else if (no_body) {
        SET(our_state, DONE);
        result = Py_NewRef(head);
    }
    else if (declared != Py_None && PyLong_AsSsize_t(declared) != size) {
        /* the application's Content-Length disagrees: cut, or closed short */
        SET(our_state, SEND_BODY);
        PyObject *call[2] = {(PyObject *)self, body};
        PyObject *data = PyObject_VectorcallMethod(NAME_RESPONSE_DATA, call,
                                                   2 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
        PyObject *end = data == NULL ? NULL : PyObject_VectorcallMethod(
            NAME_RESPONSE_END, call, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
        PyObject *partial = end == NULL ? NULL : PyNumber_Add(head, data);
        result = partial == NULL ? NULL : PyNumber_Add(partial, end);
        Py_XDECREF(data);
        Py_XDECREF(end);
        Py_XDECREF(partial);
    }
    else {
        SET(declared, Py_None);
        SET(our_state, DONE);
        self->sent = size;
        Py_ssize_t head_n = PyBytes_GET_SIZE(head);
        result = PyBytes_FromStringAndSize(NULL, head_n + size);
        if (result != NULL) {
            memcpy(PyBytes_AS_STRING(result), PyBytes_AS_STRING(head), head_n);
            memcpy(PyBytes_AS_STRING(result) + head_n, PyBytes_AS_STRING(body), size);
        }
    }
    Py_DECREF(built);
    return result;
}

static PyObject *
start_next_cycle(ConnectionObject *self, PyObject *unused)
{
    int keep = truth(self->keep_alive);
    if (keep < 0) {
        return NULL;
    }
    if (!keep || self->our_state != DONE) {
        Py_RETURN_FALSE;
    }
    if (self->their_state == BODY) {
        self->pos += self->left;  /* Connection._reusable made sure it is all buffered */
        self->left = 0;
        SET(their_state, DONE);
    }
    if (self->their_state != DONE) {
        Py_RETURN_FALSE;
    }
    SET(their_state, IDLE);
    SET(our_state, IDLE);
    SET(request, Py_None);
    SET(response_problem, Py_None);
    SET(declared, Py_None);
    SET(chunked, Py_False);
    SET(code, Py_None);
    self->sent = 0;
    Py_RETURN_TRUE;
}

/* --- the type --------------------------------------------------------- */

#define OBJECT(name, field, doc) {name, Py_T_OBJECT_EX, offsetof(ConnectionObject, field), 0, doc}
#define SIZE(name, field, doc) {name, Py_T_PYSSIZET, offsetof(ConnectionObject, field), 0, doc}
#define FLAG(name, field, doc) {name, Py_T_BOOL, offsetof(ConnectionObject, field), 0, doc}

static PyMemberDef members[] = {
    OBJECT("_buf", buf, "the bytes received; from _pos on, not consumed yet"),
    SIZE("_pos", pos, "where the bytes not consumed begin in _buf"),
    SIZE("_left", left, "body bytes left (of the current chunk, if chunked)"),
    OBJECT("_eof", eof, "the client closed its side"),
    OBJECT("their_state", their_state, "the client's side (the module's states)"),
    OBJECT("our_state", our_state, "our side: IDLE, SEND_BODY, DONE"),
    OBJECT("request", request, "the request being answered, or None"),
    OBJECT("keep_alive", keep_alive, "False once the connection must close after the response"),
    OBJECT("_keep_alive_allowed", keep_alive_allowed, "the server allows keep-alive"),
    OBJECT("draining", draining, "the next response closes, unless a request is pipelined"),
    OBJECT("body_error", body_error, "why reading the request body failed, once it did"),
    OBJECT("_no_body", no_body, "HEAD, 204, 304: the response carries no body"),
    OBJECT("_declared", declared, "bytes the response's Content-Length still expects"),
    OBJECT("_chunked", chunked, "the response body is chunked"),
    OBJECT("_continue", cont, "a 100 Continue is owed before the first body read"),
    OBJECT("code", code, "the response's status code, once its head is built"),
    SIZE("sent", sent, "response body bytes sent (the access log's %(B)s)"),
    OBJECT("_lines", lines, "a head read line by line, or None"),
    OBJECT("response_problem", response_problem, "what the application did wrong, or None"),
    OBJECT("environ_base", environ_base, "the environ's part the same for every request, or None"),
    SIZE("_head_max", head_max, "limits.fast_head_max"),
    SIZE("_fields_max", fields_max, "limits.fields_max"),
    FLAG("_c_parse", c_parse, "next_event parses a head in C (parse_head)"),
    FLAG("_c_build", c_build, "whole_response builds the head in C (build_head)"),
    FLAG("_chunk_responses", chunk_responses, "the class's chunk_responses"),
    {NULL},
};

static PyGetSetDef getset[] = {
    {"buffered", (getter)get_buffered, NULL, "bytes received and not consumed yet", NULL},
    {NULL},
};

static PyMethodDef connection_methods[] = {
    {"receive_data", (PyCFunction)receive_data, METH_O,
     "Add bytes the client sent; b\"\" means it closed its side."},
    {"next_event", (PyCFunction)(void (*)(void))next_event, METH_FASTCALL,
     "The next event from what was received; Data holds at most `max_bytes`."},
    {"whole_response", (PyCFunction)(void (*)(void))whole_response, METH_FASTCALL,
     "The whole response, ended, for a body given at once; None while the keep-alive "
     "decision may depend on bytes readable now."},
    {"start_next_cycle", (PyCFunction)start_next_cycle, METH_NOARGS,
     "After a response with keep_alive: ready for the next request; False if the "
     "connection must close instead."},
    {NULL},
};

#define OBJECT_FIELDS(apply) \
    apply(buf) apply(eof) apply(their_state) apply(our_state) apply(request) \
    apply(keep_alive) apply(keep_alive_allowed) apply(draining) apply(body_error) \
    apply(no_body) apply(declared) apply(chunked) apply(cont) apply(code) apply(lines) \
    apply(response_problem) apply(environ_base)

static PyObject *
connection_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    ConnectionObject *self = (ConnectionObject *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    /* what Connection.__init__ sets, so that no field is ever NULL */
    self->buf = PyBytes_FromStringAndSize(NULL, 0);
    if (self->buf == NULL) {
        Py_DECREF(self);
        return NULL;
    }
#define NONE(field) if (self->field == NULL) { self->field = Py_NewRef(Py_None); }
    OBJECT_FIELDS(NONE)
#undef NONE
    SET(eof, Py_False);
    SET(their_state, IDLE);
    SET(our_state, IDLE);
    SET(keep_alive, Py_True);
    SET(keep_alive_allowed, Py_True);
    SET(draining, Py_False);
    SET(no_body, Py_False);
    SET(chunked, Py_False);
    SET(cont, Py_False);
    return (PyObject *)self;
}

static int
connection_traverse(ConnectionObject *self, visitproc visit, void *arg)
{
#define VISIT(field) Py_VISIT(self->field);
    OBJECT_FIELDS(VISIT)
#undef VISIT
    return 0;
}

static int
connection_clear(ConnectionObject *self)
{
#define CLEAR(field) Py_CLEAR(self->field);
    OBJECT_FIELDS(CLEAR)
#undef CLEAR
    return 0;
}

static void
connection_dealloc(ConnectionObject *self)
{
    PyObject_GC_UnTrack(self);
    connection_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject ConnectionType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "forkserve.http._h1.ConnectionBase",
    .tp_doc = "forkserve.http.protocol.Connection's state and per-request steps, in C.",
    .tp_basicsize = sizeof(ConnectionObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_new = connection_new,
    .tp_traverse = (traverseproc)connection_traverse,
    .tp_clear = (inquiry)connection_clear,
    .tp_dealloc = (destructor)connection_dealloc,
    .tp_members = members,
    .tp_getset = getset,
    .tp_methods = connection_methods,
};

int
h1_connection_add(PyObject *module)
{
    PyObject **states[] = {&IDLE, &HEAD, &BODY, &DONE, &ERROR, &CLOSED, &SEND_BODY};
    const char *names[] = {"IDLE", "HEAD", "BODY", "DONE", "ERROR", "CLOSED", "SEND_BODY"};
    PyObject *tuple = PyTuple_New(7);
    if (tuple == NULL) {
        return -1;
    }
    for (int i = 0; i < 7; i++) {
        *states[i] = PyUnicode_InternFromString(names[i]);
        if (*states[i] == NULL) {
            Py_DECREF(tuple);
            return -1;
        }
        PyTuple_SET_ITEM(tuple, i, Py_NewRef(*states[i]));
    }
    int added = PyModule_AddObjectRef(module, "STATES", tuple);
    Py_DECREF(tuple);
    if (added < 0) {
        return -1;
    }
    PyObject **names_o[] = {&KEY_CONTENT_LENGTH, &NAME_NEXT_EVENT, &NAME_WHOLE_RESPONSE,
                            &NAME_FRAMED, &NAME_RESPONSE_DATA, &NAME_RESPONSE_END};
    const char *texts[] = {"CONTENT_LENGTH", "_next_event", "_whole_response", "_framed",
                           "response_data", "response_end"};
    for (int i = 0; i < 6; i++) {
        *names_o[i] = PyUnicode_InternFromString(texts[i]);
        if (*names_o[i] == NULL) {
            return -1;
        }
    }
    PyObject *h1 = PyImport_ImportModule("forkserve.http.h1");  /* pure Python, no cycle */
    REQUEST_ERROR = h1 == NULL ? NULL : PyObject_GetAttrString(h1, "RequestError");
    Py_XDECREF(h1);
    if (REQUEST_ERROR == NULL || PyType_Ready(&ConnectionType) < 0) {
        return -1;
    }
    return PyModule_AddObjectRef(module, "ConnectionBase", (PyObject *)&ConnectionType);
}
