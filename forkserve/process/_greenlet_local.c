/* forkserve/process/_greenlet_local.c: threading.local, one namespace per
 * greenlet, for workers that gevent has monkey-patched
 * (forkserve.process.greenlet_local says when it is used and why).
 *
 * A `local` keeps, for each greenlet that has touched it, a dict of that
 * greenlet's attributes. For each attribute read, write or delete it puts
 * the running greenlet's dict in the object's own dict slot (tp_dictoffset),
 * does what object does, and empties the slot again: so descriptors,
 * __dict__, subclasses and their __slots__ (shared by every greenlet, as
 * in threading.local) behave as on any object, and what bypasses the
 * local's own lookup (object.__getattribute__, inspect.getattr_static)
 * finds no greenlet's attributes, as on CPython's and gevent's locals.
 *
 * Invariants:
 * - The registry's `dicts` maps a greenlet's address (an int) to a 3-tuple:
 *   a weak reference to the greenlet, whose callback drops the entry when
 *   the greenlet is freed, the greenlet's dict, and the same callback if
 *   it is also rawlinked to the greenlet, else None. A gevent Greenlet's
 *   entry goes when it finishes (that rawlink), as gevent's local does: its
 *   dict may lead back to it, and then it is never freed. An entry dropped
 *   otherwise (its __init__ failed, the local cleared or freed) unlinks its
 *   callback, so a greenlet that lives on gathers none. The callbacks hold the
 *   registry, not the local: they keep working for a local a finaliser
 *   brought back after the collector cleared its weak references. The
 *   cycle registry -> entry -> weakref -> callback -> registry is broken
 *   when the local is cleared or freed (the registry's dicts emptied): a
 *   worker may run without the collector (--worker-gc off).
 * - `cached` is a strong reference to the dict of the greenlet at `owner`
 *   (an address, never dereferenced), or NULL with `owner` NULL. The
 *   callback clears both before its entry goes, so an address reused by a
 *   new greenlet never finds the dead one's dict.
 * - The slot holds a strong reference, or NULL; select() fills it last,
 *   after anything that may run Python code (a new entry's allocations may
 *   collect garbage on 3.11, a subclass's __init__ may switch greenlets),
 *   and after looking again for the running greenlet's entry.
 * - A dict is made, and a subclass's __init__ run with the arguments the
 *   local was made with, the first time a greenlet touches the local; if
 *   that __init__ raises, the entry is dropped and the next touch tries
 *   again (as CPython's threading.local does).
 * - The running greenlet comes from greenlet's C API (its capsule,
 *   greenlet._C_API, slot GREENLET_GETCURRENT), used only with a greenlet
 *   major version this was checked against (CHECKED_GREENLET_MAJORS) and
 *   once it gave greenlet.getcurrent() as a new reference at import: the
 *   module does not import otherwise, and gevent's local stays.
 */
#include "_module.h"
#include <stddef.h>  /* offsetof */

/* greenlet.h: #define PyGreenlet_GetCurrent_NUM 4, a stable part of its C
 * API since greenlet 0.4 (a new reference to the running greenlet). */
#define GREENLET_GETCURRENT 4
/* The greenlet releases whose greenlet.h was read for that slot. */
#define CHECKED_GREENLET_MAJORS "1, 2 and 3"
#define CHECKED_GREENLET_MAJOR(major) ((major) >= 1 && (major) <= 3)

typedef PyObject *(*getcurrent_fn)(void);
static getcurrent_fn greenlet_getcurrent;
/* gevent.Greenlet, and the names of its finish callbacks' methods */
static PyTypeObject *gevent_greenlet_type;
static PyObject *rawlink_name, *unlink_name;

typedef struct Local Local;

typedef struct {
    PyObject_HEAD
    PyObject *dicts;       /* {address: (weakref to greenlet, dict)} */
    Local *local;          /* whose (borrowed), NULL once it is freed */
} Registry;

struct Local {
    PyObject_HEAD
    PyObject *slot;        /* tp_dictoffset: see the invariants */
    void *owner;           /* whose dict `cached` is */
    PyObject *cached;
    Registry *registry;
    PyObject *args;        /* what __init__ gets in each new greenlet */
    PyObject *kwargs;
    PyObject *weakreflist;
};

static PyTypeObject Local_Type;
static PyTypeObject Registry_Type;

/* --- the registry: what the weakref callbacks hold --- */

static int
registry_traverse(Registry *self, visitproc visit, void *arg)
{
    Py_VISIT(self->dicts);
    return 0;
}

static int
registry_clear(Registry *self)
{
    Py_CLEAR(self->dicts);
    return 0;
}

static void
registry_dealloc(Registry *self)
{
    PyObject_GC_UnTrack(self);
    registry_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject Registry_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "forkserve.process._greenlet_local.Registry",
    .tp_basicsize = sizeof(Registry),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_traverse = (traverseproc)registry_traverse,
    .tp_clear = (inquiry)registry_clear,
    .tp_dealloc = (destructor)registry_dealloc,
};

static void
forget_owner(Local *local)
{
    local->owner = NULL;
    Py_CLEAR(local->cached);
}

/* The callback of one greenlet's entry, from its weak reference (the
 * greenlet is freed) or, for a gevent Greenlet, from its rawlink (it has
 * finished): `data` is (registry, the greenlet's address). */
static PyObject *
release(PyObject *data, PyObject *Py_UNUSED(greenlet_ref))
{
    Registry *registry = (Registry *)PyTuple_GET_ITEM(data, 0);
    PyObject *key = PyTuple_GET_ITEM(data, 1);
    if (registry->local != NULL && registry->local->owner == PyLong_AsVoidPtr(key)) {
        forget_owner(registry->local);
    }
    if (registry->dicts != NULL && PyDict_DelItem(registry->dicts, key) < 0) {
        PyErr_Clear();  /* already gone: the local was cleared */
    }
    Py_RETURN_NONE;
}

static PyMethodDef release_def = {"release", (PyCFunction)release, METH_O, NULL};

/* The exception being raised, taken out and put back as it was: Python
 * code (unlink) must not run with one set. */
typedef struct {
#if PY_VERSION_HEX >= 0x030C0000
    PyObject *raised;
#else
    PyObject *type, *value, *traceback;
#endif
} SavedError;

static void
save_error(SavedError *saved)
{
#if PY_VERSION_HEX >= 0x030C0000
    saved->raised = PyErr_GetRaisedException();
#else
    PyErr_Fetch(&saved->type, &saved->value, &saved->traceback);
#endif
}

static void
restore_error(SavedError *saved)
{
#if PY_VERSION_HEX >= 0x030C0000
    PyErr_SetRaisedException(saved->raised);
#else
    PyErr_Restore(saved->type, saved->value, saved->traceback);
#endif
}

/* Take the finish callback `link` back from `greenlet` (its unlink), so a
 * greenlet that lives on does not gather one per local it touched; as
 * gevent's local does. A failure is reported, not raised: the entry goes
 * anyway. No exception may be set. */
static void
unlink_from(PyObject *greenlet, PyObject *link)
{
    PyObject *done = PyObject_CallMethodOneArg(greenlet, unlink_name, link);
    if (done == NULL) {
        PyErr_WriteUnraisable(link);
    }
    Py_XDECREF(done);
}

/* unlink_from for an entry's greenlet, if it is alive and was linked. */
static void
unlink_entry(PyObject *entry)
{
    PyObject *link = PyTuple_GET_ITEM(entry, 2);
    if (link == Py_None) {
        return;
    }
    PyObject *greenlet;
#if PY_VERSION_HEX >= 0x030D0000
    if (PyWeakref_GetRef(PyTuple_GET_ITEM(entry, 0), &greenlet) < 0) {
        PyErr_WriteUnraisable(link);
        return;
    }
#else
    greenlet = PyWeakref_GetObject(PyTuple_GET_ITEM(entry, 0));
    greenlet = greenlet != NULL && greenlet != Py_None ? Py_NewRef(greenlet) : NULL;
#endif
    if (greenlet != NULL) {  /* else it is gone, and its links with it */
        unlink_from(greenlet, link);
        Py_DECREF(greenlet);
    }
}

/* A new entry for `greenlet` at `key`: (weakref, new dict, the finish
 * callback linked to a gevent Greenlet or None). */
static PyObject *
new_entry(Local *self, PyObject *greenlet, PyObject *key)
{
    PyObject *data = PyTuple_Pack(2, (PyObject *)self->registry, key);
    if (data == NULL) {
        return NULL;
    }
    PyObject *callback = PyCFunction_New(&release_def, data);
    Py_DECREF(data);
    if (callback == NULL) {
        return NULL;
    }
    PyObject *ref = PyWeakref_NewRef(greenlet, callback);
    if (ref == NULL) {
        Py_DECREF(callback);
        return NULL;
    }
    /* A gevent Greenlet's attributes go when it finishes: they may lead
     * back to it (a request that keeps it), and then it is never freed. */
    PyObject *link = Py_None;
    if (PyObject_TypeCheck(greenlet, gevent_greenlet_type)) {
        PyObject *linked = PyObject_CallMethodOneArg(greenlet, rawlink_name, callback);
        if (linked == NULL) {
            Py_DECREF(callback);
            Py_DECREF(ref);
            return NULL;
        }
        Py_DECREF(linked);
        link = callback;
    }
    PyObject *dict = PyDict_New();
    PyObject *entry = dict != NULL ? PyTuple_Pack(3, ref, dict, link) : NULL;
    Py_XDECREF(dict);
    Py_DECREF(ref);
    if (entry == NULL && link != Py_None) {
        SavedError saved;
        save_error(&saved);
        unlink_from(greenlet, link);
        restore_error(&saved);
    }
    Py_DECREF(callback);
    return entry;
}

static void
set_slot(Local *self, PyObject *dict)
{
    PyObject *old = self->slot;
    Py_XINCREF(dict);
    self->slot = dict;
    Py_XDECREF(old);
}

/* Drop `key`'s entry (its __init__ failed), with the exception taken out
 * by the caller. */
static void
drop_entry(Local *self, PyObject *key, void *greenlet)
{
    if (self->owner == greenlet) {
        forget_owner(self);
    }
    PyObject *dicts = self->registry->dicts;
    PyObject *entry = dicts != NULL ? PyDict_GetItemWithError(dicts, key) : NULL;
    if (entry == NULL) {
        PyErr_Clear();
        return;
    }
    Py_INCREF(entry);
    if (PyDict_DelItem(dicts, key) < 0) {
        PyErr_Clear();
    }
    unlink_entry(entry);
    Py_DECREF(entry);
}

/* Drop a new entry that was not stored, keeping the exception set if any. */
static void
discard_entry(PyObject *entry)
{
    SavedError saved;
    save_error(&saved);
    unlink_entry(entry);
    restore_error(&saved);
    Py_DECREF(entry);
}

/* Fill the slot with the running greenlet's dict: 0, or -1 with an
 * exception set. `init` says whether a new greenlet's dict gets the
 * subclass's __init__ (not while the local itself is being made). */
static int
select_dict(Local *self, int init)
{
    for (;;) {
        PyObject *greenlet = greenlet_getcurrent();
        if (greenlet == NULL) {
            return -1;
        }
        if ((void *)greenlet == self->owner) {
            Py_DECREF(greenlet);
            set_slot(self, self->cached);
            return 0;
        }
        if (self->registry->dicts == NULL) {  /* cleared by the collector */
            Py_DECREF(greenlet);
            PyErr_SetString(PyExc_RuntimeError, "the local was cleared");
            return -1;
        }
        PyObject *key = PyLong_FromVoidPtr(greenlet);
        if (key == NULL) {
            Py_DECREF(greenlet);
            return -1;
        }
        PyObject *entry = PyDict_GetItemWithError(self->registry->dicts, key);
        if (entry != NULL) {
            /* Frees nothing: the old cached dict has its entry too. */
            PyObject *old = self->cached;
            self->cached = Py_NewRef(PyTuple_GET_ITEM(entry, 1));
            self->owner = greenlet;
            Py_XDECREF(old);
            Py_DECREF(key);
            Py_DECREF(greenlet);
            set_slot(self, self->cached);
            return 0;
        }
        if (PyErr_Occurred()) {
            goto failed;
        }
        /* Its allocations may run a collection, and so finalisers that
         * touch this local: look again before adding ours. */
        entry = new_entry(self, greenlet, key);
        if (entry == NULL) {
            goto failed;
        }
        if (self->registry->dicts == NULL) {  /* that collection cleared it */
            discard_entry(entry);
            PyErr_SetString(PyExc_RuntimeError, "the local was cleared");
            goto failed;
        }
        PyObject *found = PyDict_GetItemWithError(self->registry->dicts, key);
        if (found != NULL || PyErr_Occurred()) {
            discard_entry(entry);  /* (found is only compared with NULL after) */
            Py_DECREF(key);
            Py_DECREF(greenlet);
            if (found == NULL) {
                return -1;
            }
            continue;  /* one made meanwhile: select it */
        }
        if (PyDict_SetItem(self->registry->dicts, key, entry) < 0) {
            discard_entry(entry);
            goto failed;
        }
        Py_DECREF(entry);
        initproc tp_init = Py_TYPE(self)->tp_init;
        if (init && tp_init != PyBaseObject_Type.tp_init) {
            /* __init__ reads and writes through select_dict itself, and may
             * switch greenlets: ours is selected again once it returns. */
            if (tp_init((PyObject *)self, self->args, self->kwargs) < 0) {
                SavedError saved;
                save_error(&saved);
                drop_entry(self, key, greenlet);
                restore_error(&saved);
                goto failed;
            }
        }
        Py_DECREF(key);
        Py_DECREF(greenlet);
        /* and round again: the entry is found, or made again if __init__
         * or a finaliser dropped it */
        init = 0;
        continue;
    failed:
        Py_DECREF(key);
        Py_DECREF(greenlet);
        return -1;
    }
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
    self->registry = PyObject_GC_New(Registry, &Registry_Type);
    if (self->registry != NULL) {
        self->registry->local = self;
        self->registry->dicts = PyDict_New();
        PyObject_GC_Track(self->registry);
    }
    if (self->kwargs == NULL || self->registry == NULL || self->registry->dicts == NULL ||
        select_dict(self, 0) < 0) {
        Py_DECREF(self);
        return NULL;
    }
    set_slot(self, NULL);
    return (PyObject *)self;
}

static int
local_traverse(Local *self, visitproc visit, void *arg)
{
    Py_VISIT(self->slot);
    Py_VISIT(self->cached);
    Py_VISIT(self->registry);
    Py_VISIT(self->args);
    Py_VISIT(self->kwargs);
    return 0;
}

/* Everything but the registry itself, which stays (emptied) until the
 * local is freed: a finaliser may still touch a cleared local. */
static int
local_clear(Local *self)
{
    forget_owner(self);
    Py_CLEAR(self->slot);
    if (self->registry != NULL && self->registry->dicts != NULL) {
        SavedError saved;  /* a dealloc may run while an exception is raised */
        save_error(&saved);
        PyObject *entries = PyDict_Values(self->registry->dicts);
        PyDict_Clear(self->registry->dicts);
        if (entries != NULL) {
            /* after the clear: unlink runs Python code */
            for (Py_ssize_t i = 0; i < PyList_GET_SIZE(entries); i++) {
                unlink_entry(PyList_GET_ITEM(entries, i));
            }
            Py_DECREF(entries);
        }
        else {
            PyErr_WriteUnraisable((PyObject *)self);  /* no memory: links stay */
        }
        restore_error(&saved);
    }
    Py_CLEAR(self->args);
    Py_CLEAR(self->kwargs);
    return 0;
}

static void
local_dealloc(Local *self)
{
    PyObject_GC_UnTrack(self);
    if (self->weakreflist != NULL) {
        PyObject_ClearWeakRefs((PyObject *)self);
    }
    local_clear(self);
    if (self->registry != NULL) {
        self->registry->local = NULL;
        Py_CLEAR(self->registry);
    }
    /* A Python subclass's dealloc drops the type's reference after this. */
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
local_getattro(Local *self, PyObject *name)
{
    if (select_dict(self, 1) < 0) {
        return NULL;
    }
    PyObject *value = PyObject_GenericGetAttr((PyObject *)self, name);
    set_slot(self, NULL);
    return value;
}

static int
local_setattro(Local *self, PyObject *name, PyObject *value)
{
    if (select_dict(self, 1) < 0) {
        return -1;
    }
    int result = PyObject_GenericSetAttr((PyObject *)self, name, value);
    set_slot(self, NULL);
    return result;
}

static PyObject *
greenlets(PyObject *Py_UNUSED(module), PyObject *local)
{
    if (!PyObject_TypeCheck(local, &Local_Type)) {
        PyErr_SetString(PyExc_TypeError, "greenlets() takes a local");
        return NULL;
    }
    PyObject *dicts = ((Local *)local)->registry->dicts;
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
    .tp_dictoffset = offsetof(Local, slot),
    .tp_weaklistoffset = offsetof(Local, weakreflist),
};

/* greenlet's major version (what its __version__ starts with), or -1
 * with an exception set. */
static long
greenlet_major(PyObject *module)
{
    PyObject *version = PyObject_GetAttrString(module, "__version__");
    PyObject *dot = PyUnicode_FromString(".");
    PyObject *parts = version != NULL && dot != NULL && PyUnicode_Check(version) ?
        PyUnicode_Split(version, dot, 1) : NULL;
    PyObject *number = parts != NULL ? PyLong_FromUnicodeObject(PyList_GET_ITEM(parts, 0), 10)
                                     : NULL;
    long major = number != NULL ? PyLong_AsLong(number) : -1;
    Py_XDECREF(number);
    Py_XDECREF(parts);
    Py_XDECREF(dot);
    Py_XDECREF(version);
    if (major < 0) {
        PyErr_Clear();
        PyErr_SetString(PyExc_ImportError, "greenlet.__version__ does not start with a number");
    }
    return major;
}

/* greenlet_getcurrent from greenlet's capsule, once greenlet's version is
 * one that was checked, and the check that it gives what
 * greenlet.getcurrent() returns, as a new reference. */
static int
bind_greenlet(void)
{
    PyObject *module = PyImport_ImportModule("greenlet");
    if (module == NULL) {
        return -1;
    }
    long major = greenlet_major(module);
    if (major < 0) {
        Py_DECREF(module);
        return -1;
    }
    if (!CHECKED_GREENLET_MAJOR(major)) {
        Py_DECREF(module);
        PyErr_Format(PyExc_ImportError,
                     "greenlet %ld is not one whose C API this was checked against "
                     "(greenlet " CHECKED_GREENLET_MAJORS ")", major);
        return -1;
    }
    void **api = (void **)PyCapsule_Import("greenlet._C_API", 0);
    if (api == NULL) {
        Py_DECREF(module);
        PyErr_Clear();
        PyErr_SetString(PyExc_ImportError, "greenlet has no C API capsule (greenlet._C_API)");
        return -1;
    }
    greenlet_getcurrent = (getcurrent_fn)api[GREENLET_GETCURRENT];
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

/* gevent.Greenlet, whose finish drops its attributes. */
static int
bind_gevent(void)
{
    PyObject *gevent = PyImport_ImportModule("gevent");
    if (gevent == NULL) {
        return -1;
    }
    PyObject *type = PyObject_GetAttrString(gevent, "Greenlet");
    Py_DECREF(gevent);
    if (type == NULL) {
        return -1;
    }
    if (!PyType_Check(type)) {
        Py_DECREF(type);
        PyErr_SetString(PyExc_ImportError, "gevent.Greenlet is not a type");
        return -1;
    }
    gevent_greenlet_type = (PyTypeObject *)type;  /* kept for the process's life */
    rawlink_name = PyUnicode_InternFromString("rawlink");
    unlink_name = PyUnicode_InternFromString("unlink");
    return rawlink_name != NULL && unlink_name != NULL ? 0 : -1;
}

static int
fill(PyObject *module)
{
    if (bind_greenlet() < 0 || bind_gevent() < 0 || PyType_Ready(&Registry_Type) < 0 ||
        PyType_Ready(&Local_Type) < 0) {
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
