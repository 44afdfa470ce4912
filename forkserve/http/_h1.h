/* forkserve/http/_h1.h: what the two parts of forkserve.http._h1 share.
 *
 * _h1.c is the grammar's fast path (a request head in, a response head
 * out, the Request record, the Date value); _h1_connection.c is the
 * connection object's per-request steps (forkserve.http.protocol's
 * ConnectionBase), which call the first part directly.
 */
#ifndef FORKSERVE_H1_H
#define FORKSERVE_H1_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* forkserve.http.protocol.Request in C (the fields parse_head fills). */
typedef struct {
    PyObject_HEAD
    PyObject *method, *target, *version, *line, *headers, *path, *query, *authority, *decoded,
        *environ, *chunked, *length, *expect_continue;
} RequestObject;

extern PyTypeObject H1_RequestType;

/* The module's functions, with their Python signatures (METH_FASTCALL). */
PyObject *h1_parse_head(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *h1_build_head(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

/* Interned "HTTP/1.0" and "HTTP/1.1", the versions parse_head gives. */
extern PyObject *H1_HTTP10, *H1_HTTP11;

/* Adds ConnectionBase and STATES to the module; -1 with an exception set. */
int h1_connection_add(PyObject *module);

#endif /* FORKSERVE_H1_H */
