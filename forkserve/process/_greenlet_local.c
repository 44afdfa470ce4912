/* forkserve/process/_greenlet_local.c: threading.local, one namespace per
 * greenlet, for workers that gevent has monkey-patched
 * (forkserve.process.greenlet_local says when it is used and why).
 *
 * A `local` keeps, for each greenlet that has touched it, a dict of that
 * greenlet's attributes. Before every attribute read, write or delete it
 * makes the dict of the greenlet that runs the object's own dict (the
 * tp_dictoffset slot) and then does what object does: so descriptors,
 * __dict__, subclasses and their __slots__ (shared by every greenlet, as
 * in threading.local) behave as on any object. Python 2's thread-local
 * worked the same way.
 *
 * Invariants:
 * - `dicts` maps a greenlet's address (an int) to a 2-tuple: a weak
 *   reference to the greenlet, whose callback drops the entry when the
 *   greenlet is freed, and the greenlet's dict. The callback holds the
 *   local only weakly, so neither keeps the other alive (workers run with
 *   the collector off: a cycle here would be a leak).
 * - `dict` is a strong reference to the dict of the greenlet at `owner`
 *   (an address, never dereferenced), or NULL with `owner` NULL. The
 *   callback clears both before the entry goes, so an address reused by a
 *   new greenlet never finds the dead one's dict.
 * - A dict is made, and a subclass's __init__ run with the arguments the
 *   local was made with, the first time a greenlet touches the local; if
 *   that __init__ raises, the entry is dropped and the next touch tries
 *   again.
 * - The running greenlet comes from greenlet's C API (its capsule,
 *   greenlet._C_API, slot GREENLET_GETCURRENT), checked at import against
 *   greenlet.getcurrent(), and to return a new reference: the module does
 *   not import where either differs.
 */
#include "_module.h"
#include <stddef.h>  /* offsetof */

/* greenlet.h: #define PyGreenlet_GetCurrent_NUM 4, a stable part of its C
 * API since greenlet 0.4 (a new reference to the running greenlet). */
#define GREENLET_GETCURRENT 4

typedef PyObject *(*getcurrent_fn)(void);
static getcurrent_fn greenlet_getcurrent;

typedef struct {
    PyObject_HEAD
    PyObject *dict;        /* the running greenlet's dict: tp_dictoffset */
    void *owner;           /* whose dict `dict` is */
    PyObject *dicts;       /* {address: (weakref to greenlet, dict)} */
    PyObject *args;        /* what __init__ gets in each new greenlet */
    PyObject *kwargs;
    PyObject *self_ref;    /* a weak reference to this local */
    PyObject *weakreflist;
} Local;

static PyTypeObject Local_Type;

/* The object a weak reference points to, as a new reference (NULL, no
 * error, when it is gone). */
static PyObject *
weakref_target(PyObject *ref)
{
#if PY_VERSION_HEX >= 0x030D0000
    PyObject *target;
    if (PyWeakref_GetRef(ref, &target) < 0) {
        PyErr_Clear();
        return NULL;
    }
    return target;
#else
    PyObject *target = PyWeakref_GetObject(ref);
    if (target == NULL || target == Py_None) {
        PyErr_Clear();
        return NULL;
    }
    Py_INCREF(target);
    return target;
#endif
}

/* The weakref callback of one greenlet's entry: `data` is (weak reference
 * to the local, the greenlet's address). */
static PyObject *
release(PyObject *data, PyObject *Py_UNUSED(greenlet_ref))
{
    Local *self = (Local *)weakref_target(PyTuple_GET_ITEM(data, 0));
    if (self == NULL) {
        Py_RETURN_NONE;
    }
    PyObject *key = PyTuple_GET_ITEM(data, 1);
    if (self->owner == PyLong_AsVoidPtr(key)) {
        self->owner = NULL;
        Py_CLEAR(self->dict);
    }
    if (self->dicts != NULL && PyDict_DelItem(self->dicts, key) < 0) {
        PyErr_Clear();  /* already gone: the local was cleared */
    }
    Py_DECREF(self);
    Py_RETURN_NONE;
}

static PyMethodDef release_def = {"release", (PyCFunction)release, METH_O, NULL};

/* A new entry for `greenlet` at `key`: (weakref, new dict). */
static PyObject *
new_entry(Local *self, PyObject *greenlet, PyObject *key)
{
    PyObject *data = PyTuple_Pack(2, self->self_ref, key);
    if (data == NULL) {
        return NULL;
    }
    PyObject *callback = PyCFunction_New(&release_def, data);
    Py_DECREF(data);
    if (callback == NULL) {
        return NULL;
    }
    PyObject *ref = PyWeakref_NewRef(greenlet, callback);
    Py_DECREF(callback);
    if (ref == NULL) {
        return NULL;
    }
    PyObject *dict = PyDict_New();
    if (dict == NULL) {
        Py_DECREF(ref);
        return NULL;
    }
    PyObject *entry = PyTuple_Pack(2, ref, dict);
    Py_DECREF(ref);
    Py_DECREF(dict);
    return entry;
}

static void
make_current(Local *self, void *owner, PyObject *dict)
{
    PyObject *old = self->dict;
    Py_INCREF(dict);
    self->dict = dict;
    self->owner = owner;
    Py_XDECREF(old);
}

/* Make the running greenlet's dict the local's own: 0, or -1 with an
 * exception set. `init` says whether a new greenlet's dict gets the
 * subclass's __init__ (not while the local itself is being made). */
static int
select_dict(Local *self, int init)
{
    PyObject *greenlet = greenlet_getcurrent();
    if (greenlet == NULL) {
        return -1;
    }
    if ((void *)greenlet == self->owner) {
        Py_DECREF(greenlet);
        return 0;
    }
    if (self->dicts == NULL) {  /* cleared by the collector */
        Py_DECREF(greenlet);
        PyErr_SetString(PyExc_RuntimeError, "the local was cleared");
        return -1;
    }
    PyObject *key = PyLong_FromVoidPtr(greenlet);
    if (key == NULL) {
        Py_DECREF(greenlet);
        return -1;
    }
    int result = -1;
    PyObject *entry = PyDict_GetItemWithError(self->dicts, key);
    if (entry != NULL) {
        make_current(self, greenlet, PyTuple_GET_ITEM(entry, 1));
        result = 0;
        goto done;
    }
    if (PyErr_Occurred()) {
        goto done;
    }
    entry = new_entry(self, greenlet, key);
    if (entry == NULL) {
        goto done;
    }
    if (PyDict_SetItem(self->dicts, key, entry) < 0) {
        Py_DECREF(entry);
        goto done;
    }
    make_current(self, greenlet, PyTuple_GET_ITEM(entry, 1));
    Py_DECREF(entry);
    result = 0;
    initproc tp_init = Py_TYPE(self)->tp_init;
    if (init && tp_init != PyBaseObject_Type.tp_init) {
        /* The subclass's __init__ may switch greenlets, which select their
         * own dicts: select ours again once it returns. */
        if (tp_init((PyObject *)self, self->args, self->kwargs) < 0) {
            PyObject *type, *value, *traceback;
            PyErr_Fetch(&type, &value, &traceback);
            if (self->owner == (void *)greenlet) {
                self->owner = NULL;
                Py_CLEAR(self->dict);
            }
            if (PyDict_DelItem(self->dicts, key) < 0) {
                PyErr_Clear();
            }
            PyErr_Restore(type, value, traceback);
            result = -1;
        }
        else {
            result = select_dict(self, 0);
        }
    }
done:
    Py_DECREF(key);
    Py_DECREF(greenlet);
    return result;
}

static PyObject *
local_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    if (type->tp_init == PyBaseObject_Type.tp_init &&
        (PyTuple_GET_SIZE(args) || (kwargs != NULL && PyDict_GET_SIZE(kwargs)))) {
        PyErr_SetString(PyExc_TypeError, "Initialization arguments are not supported");
        return NULL;
    }
    Local *self = (Local *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->args = Py_NewRef(args);
    self->kwargs = kwargs != NULL ? Py_NewRef(kwargs) : PyDict_New();
    self->dicts = PyDict_New();
    self->self_ref = PyWeakref_NewRef((PyObject *)self, NULL);
    if (self->kwargs == NULL || self->dicts == NULL || self->self_ref == NULL ||
        select_dict(self, 0) < 0) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static int
local_traverse(Local *self, visitproc visit, void *arg)
{
    Py_VISIT(self->dict);
    Py_VISIT(self->dicts);
    Py_VISIT(self->args);
    Py_VISIT(self->kwargs);
    return 0;
}

static int
local_clear(Local *self)
{
    self->owner = NULL;
    Py_CLEAR(self->dict);
    Py_CLEAR(self->dicts);
    Py_CLEAR(self->args);
    Py_CLEAR(self->kwargs);
    return 0;
}

static void
local_dealloc(Local *self)
{
    PyTypeObject *type = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    if (self->weakreflist != NULL) {
        PyObject_ClearWeakRefs((PyObject *)self);
    }
    local_clear(self);
    Py_CLEAR(self->self_ref);
    /* A Python subclass's dealloc drops the type's reference after this. */
    type->tp_free((PyObject *)self);
}

static PyObject *
local_getattro(Local *self, PyObject *name)
{
    if (select_dict(self, 1) < 0) {
        return NULL;
    }
    return PyObject_GenericGetAttr((PyObject *)self, name);
}

static int
local_setattro(Local *self, PyObject *name, PyObject *value)
{
    if (select_dict(self, 1) < 0) {
        return -1;
    }
    return PyObject_GenericSetAttr((PyObject *)self, name, value);
}

static PyObject *
greenlets(PyObject *Py_UNUSED(module), PyObject *local)
{
    if (!PyObject_TypeCheck(local, &Local_Type)) {
        PyErr_SetString(PyExc_TypeError, "greenlets() takes a local");
        return NULL;
    }
    PyObject *dicts = ((Local *)local)->dicts;
    return PyLong_FromSsize_t(dicts != NULL ? PyDict_GET_SIZE(dicts) : 0);
}

static PyMethodDef module_methods[] = {
    {"greenlets", greenlets, METH_O,
     "greenlets(local): how many greenlets have attributes in it (for tests)."},
    {NULL},
};

static PyGetSetDef local_getset[] = {
    {"__dict__", PyObject_GenericGetDict, NULL,
     "The running greenlet's attributes.", NULL},
    {NULL},
};

static PyTypeObject Local_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "forkserve.process._greenlet_local.local",
    .tp_doc = "Thread-local data, one namespace per greenlet.",
    .tp_basicsize = sizeof(Local),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_new = local_new,
    .tp_dealloc = (destructor)local_dealloc,
    .tp_traverse = (traverseproc)local_traverse,
    .tp_clear = (inquiry)local_clear,
    .tp_getattro = (getattrofunc)local_getattro,
    .tp_setattro = (setattrofunc)local_setattro,
    .tp_getset = local_getset,
    .tp_dictoffset = offsetof(Local, dict),
    .tp_weaklistoffset = offsetof(Local, weakreflist),
};

/* greenlet_getcurrent from greenlet's capsule, and the check that it is
 * what greenlet.getcurrent() returns. */
static int
bind_greenlet(void)
{
    void **api = (void **)PyCapsule_Import("greenlet._C_API", 0);
    if (api == NULL) {
        return -1;
    }
    greenlet_getcurrent = (getcurrent_fn)api[GREENLET_GETCURRENT];
    PyObject *module = PyImport_ImportModule("greenlet");
    if (module == NULL) {
        return -1;
    }
    PyObject *expected = PyObject_CallMethod(module, "getcurrent", NULL);
    Py_DECREF(module);
    if (expected == NULL) {
        return -1;
    }
    Py_ssize_t before = Py_REFCNT(expected);
    PyObject *got = greenlet_getcurrent();
    /* The running greenlet, as a new reference (select_dict drops it). */
    int same = got == expected && Py_REFCNT(expected) == before + 1;
    if (same) {
        Py_DECREF(got);  /* otherwise whose reference it is is unknown: kept */
    }
    Py_DECREF(expected);
    if (!same) {
        PyErr_SetString(PyExc_ImportError,
                        "greenlet's C API does not give the running greenlet as a new "
                        "reference at slot 4 (PyGreenlet_GetCurrent): gevent's local stays");
        return -1;
    }
    return 0;
}

static int
fill(PyObject *module)
{
    if (bind_greenlet() < 0 || PyType_Ready(&Local_Type) < 0) {
        return -1;
    }
    Py_INCREF(&Local_Type);
    if (PyModule_AddObject(module, "local", (PyObject *)&Local_Type) < 0) {
        Py_DECREF(&Local_Type);
        return -1;
    }
    return 0;
}

static struct PyModuleDef module_def = MODULE_DEF(
    "forkserve.process._greenlet_local",
    "threading.local, one namespace per greenlet, in C "
    "(forkserve.process.greenlet_local).",
    module_methods);

PyMODINIT_FUNC
PyInit__greenlet_local(void)
{
    return module_create(&module_def, fill);
}
