/* forkserve.memory._immortal: the walker behind forkserve.share() and
 * --share-heap.
 *
 * walk(root, known, utf8) prepares everything reachable from root
 * through the kinds a dataset is made of (dict keys and values, list, tuple
 * and their subclasses such as named tuples, set, frozenset, str, bytes,
 * int, float, and instances of Python classes: with a __dict__, with
 * __slots__, dataclasses of either kind); share_heap(roots, known, utf8)
 * does the same for every object reachable from the items of the list
 * roots, of every kind (the caller passes gc.get_objects() and sys.modules).
 * Preparing an object means that reading it in a forked worker writes
 * nothing to it:
 *   - str, bytes and frozenset get their hash cached; so do tuples of
 *     builtins from 3.14, which caches tuple hashes in the tuple;
 *   - non-ASCII str get their UTF-8 form cached when `utf8` is true;
 *   - it is made immortal, the way this version's interpreter reads it:
 *       3.12, 3.13: the reference count word holds _Py_IMMORTAL_REFCNT;
 *       3.14, 3.15: _Py_SetImmortalUntracked(), which also sets the
 *         immortal bit of ob_flags that the interpreter's stack references
 *         read (a count alone leaves an object that is still counted).
 *     Those four are the versions this file was checked against (their
 *     Include/object.h, refcount.h, internal/pycore_object.h and
 *     pycore_stackref.h); CHECKED is 0 anywhere else (another version,
 *     32-bit, free-threaded or a debug build), where only hash_only() exists.
 * Each returns (objects, bytes, mortal, seeds, skipped, leaders): how many
 * objects were made immortal and roughly what sys.getsizeof() says they
 * weigh; {type: count} of the objects left mortal by the rule below, and of
 * the seeds among them; for walk(), {type: count} of the objects found in
 * the data that it does not go into; and [(seed, count)] of the LEADERS
 * seeds that kept the most objects mortal (each mortal object counted for
 * the first seed that reaches it).
 *
 * The mortality rule. An immortal object is never freed, so its finaliser
 * would never run. An object therefore stays mortal when its death can run
 * code or release something outside Python's data, or when the walk cannot
 * see what it holds (a "seed"):
 *   - its type has a finaliser (tp_finalize: __del__, files, sockets,
 *     generators and coroutines in any state; or tp_del);
 *   - a weakref points at it: with a callback (WeakValueDictionary values,
 *     weakref.finalize, WeakSet members), or without one unless it is a
 *     module, function or code object (the referent must die for the
 *     weakref to say None);
 *   - it is a buffer view or an exporter that counts its views (its type has
 *     bf_releasebuffer: memoryview, array, mmap; a bytearray only while a
 *     view holds it): a view's death releases the export;
 *   - it is an instance of one of known's resources, the types that own an
 *     OS resource or run code when they die without a finaliser (mmap,
 *     epoll, greenlet, ...: the caller's list);
 *   - its type is a C type the collector does not track, so that no walk
 *     can see what it holds (an lru_cache's links, a capsule), unless the
 *     caller names it plain data (object, bool, range, bytearray, and known's
 *     plain: date, Decimal, ...;
 *     known's zoned, datetime and time, while their tzinfo is None or plain);
 *   - (share_heap() only) it holds a frame (a traceback, through its frame
 *     the locals of a function that raised): frames are never marked;
 *   - (walk() only) it holds an object walk() does not go into that is a
 *     seed or could hold one (any other GC-tracked object);
 *   - (share_heap() only) the application asked (forkserve.keep_mortal):
 *     then everything it holds is mortal too, but modules, classes,
 *     functions and code (spread_down from F_ASKED nodes);
 * and so does every object from which a seed is reachable through data, so
 * that dropping a container, or an object two levels up, still frees what
 * it holds; and so does the state a seed of a C type keeps in C objects and
 * containers (spread_down: a sqlite connection's cached statements, which
 * hold its database file open until they are freed). Modules, classes and code objects are never made mortal on
 * behalf of what they hold, and the walk up stops at them: they live as
 * long as the program, and were they followed, every instance would reach
 * its class, and nothing would be shared. A function is followed only from
 * what it alone holds (its closure, defaults and __dict__: a wrapper closing
 * over a file), never from its globals or code, or every function would reach
 * its module's globals. A builtin method bound to an object (file.read kept
 * in a dict) is followed like any data.
 *
 * How, and the invariants that make it safe:
 * - No Python code runs during a walk and nothing releases the GIL: only C
 *   functions of builtin types run (hashes, __sizeof__ of dict/set/int/str,
 *   tp_traverse, the generator's gi_suspended getter), and nothing is
 *   allocated that the collector tracks, so no collection, finaliser or
 *   other thread runs and nothing is freed under us. No reference is taken.
 * - Leaves (exact str, bytes, int, float, complex: they hold nothing and
 *   have no finaliser) are made immortal as they are found; immortality is
 *   their visited mark.
 * - Every other object found is a node: appended to `nodes` with its
 *   reference count word as it was, then tagged: the word is set to
 *   (index + 1) << 32 | IMMORTAL_LOW, which the interpreter reads as
 *   immortal (an incref or decref by any C code changes nothing that
 *   matters) and which names the node exactly: an object is a node iff the
 *   high half, minus one, indexes `nodes` at that very object. Nodes are
 *   the work list too (breadth first, no recursion, so any depth).
 * - An edge parent -> child is recorded only where it can carry mortality
 *   up: the child is a node and the parent is not a module, class,
 *   function or code object.
 * - When the walk ends, seeds are marked mortal and mortality spreads up
 *   the recorded edges (linear in their number). Then every node gets its
 *   word back and, unless mortal, is made immortal. On any failure
 *   (MemoryError) every node gets its word back and nothing more is done:
 *   no container stays marked without having been looked inside, and the
 *   leaves already marked are complete, so calling again finishes the job.
 * - Objects that were immortal before the walk (None, small ints, interned
 *   and static strings, anything an earlier walk marked) are not looked
 *   inside, except the root of walk(), so share(x) after adding to x
 *   reaches the additions. Interned str are the interpreter's and never
 *   marked; frame objects are never marked (a running frame's object is
 *   reused as the function returns).
 * - A seed is decided from its type and header alone: the only calls are
 *   the tzinfo getter of exact datetime and time objects (C, no Python).
 * - hash_only(root, utf8) is walk() without marking, for the versions
 *   above that CHECKED excludes and 3.11: an address bitmap (_addrset.h's
 *   BitSet) is its visited mark.
 *
 * The caller (forkserve/memory/sharing.py) decides whether marking is safe
 * here: it checks the version and runs a probe in a forked child first.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <frameobject.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "_addrset.h"
#include "_module.h"

#if PY_VERSION_HEX >= 0x030C0000 && PY_VERSION_HEX < 0x03100000 \
    && SIZEOF_VOID_P == 8 && !defined(Py_GIL_DISABLED) \
    && !defined(Py_REF_DEBUG) && !defined(Py_TRACE_REFS)
#define CHECKED 1
#else
#define CHECKED 0
#endif

#if CHECKED && PY_VERSION_HEX >= 0x030E0000
/* Exported (PyAPI_FUNC) by 3.14 and 3.15, declared in their internal
   pycore_object.h: sets ob_flags to _Py_IMMORTAL_FLAGS and the count to
   _Py_IMMORTAL_INITIAL_REFCNT, unless the object is immortal already. */
PyAPI_FUNC(void) _Py_SetImmortalUntracked(PyObject *op);
#define IMMORTAL_LOW 0xC0000000u
#define TUPLE_HASH_CACHED 1
#elif CHECKED
#define IMMORTAL_LOW 0xFFFFFFFFu   /* _Py_IMMORTAL_REFCNT, 64-bit 3.12 and 3.13 */
#define TUPLE_HASH_CACHED 0
#endif

#ifndef Py_TPFLAGS_MANAGED_DICT
#define Py_TPFLAGS_MANAGED_DICT 0
#endif
#ifndef Py_TPFLAGS_MANAGED_WEAKREF
#define Py_TPFLAGS_MANAGED_WEAKREF 0
#endif


/* __sizeof__ of the builtin types whose storage lives outside the object and
   has no public layout (dict keys, set tables, int digits, str subclasses'
   data). Borrowed from the immortal builtin types; set at import. */
static PyObject *dict_sizeof;
static PyObject *set_sizeof;
static PyObject *frozenset_sizeof;
static PyObject *int_sizeof;
static PyObject *str_sizeof;
/* The tp_dealloc of every class made by a class statement (subtype_dealloc,
   which has no public name): read off such a class at import. */
static destructor python_class_dealloc;

enum kind {
    K_SKIP,      /* not data: types, modules, functions, C objects */
    K_STR,
    K_BYTES,
    K_NUMBER,    /* int, float, complex (and bool) */
    K_TUPLE,
    K_LIST,
    K_DICT,
    K_SET,       /* set and frozenset */
    K_INSTANCE,  /* instance of a Python class: __dict__, __slots__ or both */
};

static enum kind
classify(PyObject *op)
{
    PyTypeObject *tp = Py_TYPE(op);
    if (tp == &PyUnicode_Type) return K_STR;
    if (tp == &PyDict_Type) return K_DICT;
    if (tp == &PyList_Type) return K_LIST;
    if (tp == &PyTuple_Type) return K_TUPLE;
    if (tp == &PyLong_Type || tp == &PyFloat_Type) return K_NUMBER;
    if (tp == &PyBytes_Type) return K_BYTES;

    unsigned long flags = tp->tp_flags;
    if (flags & Py_TPFLAGS_TYPE_SUBCLASS) return K_SKIP;
    if (flags & Py_TPFLAGS_UNICODE_SUBCLASS) return K_STR;
    if (flags & Py_TPFLAGS_DICT_SUBCLASS) return K_DICT;
    if (flags & Py_TPFLAGS_LIST_SUBCLASS) return K_LIST;
    if (flags & Py_TPFLAGS_TUPLE_SUBCLASS) return K_TUPLE;
    if (flags & Py_TPFLAGS_BYTES_SUBCLASS) return K_BYTES;
    if (flags & Py_TPFLAGS_LONG_SUBCLASS) return K_NUMBER;
    if (PyFloat_Check(op) || PyComplex_Check(op)) return K_NUMBER;
    if (PyAnySet_Check(op)) return K_SET;
    if ((flags & Py_TPFLAGS_HEAPTYPE) && tp->tp_dealloc == python_class_dealloc
        && !PyModule_Check(op)) {
        return K_INSTANCE;
    }
    return K_SKIP;
}

/* A leaf holds no reference and has no finaliser: exact builtins only. */
static int
is_leaf(PyObject *op)
{
    PyTypeObject *tp = Py_TYPE(op);
    return tp == &PyUnicode_Type || tp == &PyLong_Type || tp == &PyFloat_Type
           || tp == &PyBytes_Type || tp == &PyComplex_Type;
}

/* Modules, classes and code: mortality does not travel up through them.
   A builtin function bound to an object (file.read, kept in a dict) is that
   object's method, not a function of the program: it is followed. Python
   functions are followed only through what they alone hold (expand()). */
static int
is_stop(PyObject *op)
{
    if (PyCFunction_Check(op)) {
        PyObject *self = PyCFunction_GET_SELF(op);
        return self == NULL || PyModule_Check(self) || PyType_Check(self);
    }
    return PyModule_Check(op) || PyType_Check(op) || PyCode_Check(op);
}

/* The types the caller names (sharing.known_types()): those that own an OS
   resource without a finaliser; C types the collector does not track that
   are known to be plain data; and of those, the ones plain only while their
   tzinfo is None or plain (datetime, time). Borrowed from the walk's caller. */
typedef struct {
    PyObject *resources, *plain, *zoned;
} known_types;

static int
in_types(PyObject *types, PyTypeObject *tp)
{
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(types); i++) {
        if ((PyTypeObject *)PyTuple_GET_ITEM(types, i) == tp) return 1;
    }
    return 0;
}

/* Whether op, of a C type the collector does not track, is known to hold
   nothing whose release matters. -1 with an exception set on failure. */
static int
is_plain(PyObject *op, const known_types *known)
{
    PyTypeObject *tp = Py_TYPE(op);
    if (tp == &PyBool_Type || tp == &PyRange_Type || tp == &PyBaseObject_Type
        || tp == &PyByteArray_Type) {
        return 1;  /* a bytearray a view holds is a seed (is_seed) before this */
    }
    if (in_types(known->plain, tp)) return 1;
    if (!in_types(known->zoned, tp)) return 0;
    /* The exact C type: its tzinfo getter runs no Python code. */
    PyObject *tzinfo = PyObject_GetAttrString(op, "tzinfo");
    if (tzinfo == NULL) return -1;
    int plain = tzinfo == Py_None || in_types(known->plain, Py_TYPE(tzinfo));
    Py_DECREF(tzinfo);
    return plain;
}

/* Whether op's death can run code or release something outside Python's
   data by itself: see "The mortality rule". -1 with an exception set on
   failure. */
static int
is_seed(PyObject *op, const known_types *known)
{
    PyTypeObject *tp = Py_TYPE(op);
    if (tp == &PyDict_Type || tp == &PyList_Type || tp == &PyTuple_Type) {
        return 0;  /* the common case, settled fast: no finaliser, no weakrefs */
    }
    /* A finaliser: __del__, files, sockets; generators and coroutines in any
       state (one not started may be started by a worker). */
    if (tp->tp_finalize != NULL || tp->tp_del != NULL) return 1;
    if (tp->tp_weaklistoffset != 0 && !PyType_Check(op)) {
        /* As CPython's _PyObject_GET_WEAKREFS_LISTPTR for all but static
           types (a negative offset is 3.12+'s managed weakref list). A weak
           reference without a callback counts too (its referent must die for
           it to say None), but not to a module, function or code object,
           which live as long as the program. */
        PyWeakReference *ref = *(PyWeakReference **)((char *)op + tp->tp_weaklistoffset);
        for (; ref != NULL; ref = ref->wr_next) {
            if (ref->wr_callback != NULL
                || !(PyModule_Check(op) || PyFunction_Check(op) || PyCode_Check(op))) {
                return 1;
            }
        }
    }
    /* A view or an exporter that counts its views (memoryview, array, mmap):
       a view's death releases the export. A bytearray no view holds is data. */
    if (tp->tp_as_buffer != NULL && tp->tp_as_buffer->bf_releasebuffer != NULL
        && !(tp == &PyByteArray_Type && ((PyByteArrayObject *)op)->ob_exports == 0)) {
        return 1;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(known->resources); i++) {
        if (PyObject_TypeCheck(op, (PyTypeObject *)PyTuple_GET_ITEM(known->resources, i))) {
            return 1;
        }
    }
    /* A C type the collector does not track holds references no walk can see
       (an lru_cache's links, a capsule's pointer), unless it is known plain
       data. Leaves, classes, code and Python classes' instances (which have
       no slot that holds an object when they are not tracked) are seen. */
    if (!PyType_IS_GC(tp) && !is_leaf(op) && !PyType_Check(op) && !PyCode_Check(op)
        && tp->tp_dealloc != python_class_dealloc) {
        int plain = is_plain(op, known);
        return plain < 0 ? -1 : !plain;
    }
    return 0;
}

/* sys.getsizeof() adds the GC header (two pointers) of GC types and, from
   3.11, the two pointers before a managed dict or weakref. */
#define GC_HEADER_SIZE (2 * (Py_ssize_t)sizeof(void *))
#define MANAGED_PREHEADER_SIZE (2 * (Py_ssize_t)sizeof(void *))

static Py_ssize_t
call_sizeof(PyObject *method, PyObject *op)
{
    PyObject *result = PyObject_CallOneArg(method, op);
    if (result == NULL) return -1;
    Py_ssize_t size = PyLong_AsSsize_t(result);
    Py_DECREF(result);
    return size;
}

/* What str.__sizeof__ says, without the call, for exact (compact) str. */
static Py_ssize_t
compact_str_size(PyObject *op)
{
    Py_ssize_t length = PyUnicode_GET_LENGTH(op);
    if (PyUnicode_IS_COMPACT_ASCII(op)) {
        return (Py_ssize_t)sizeof(PyASCIIObject) + length + 1;
    }
    Py_ssize_t size = (Py_ssize_t)sizeof(PyCompactUnicodeObject)
                      + (length + 1) * PyUnicode_KIND(op);
    PyCompactUnicodeObject *compact = (PyCompactUnicodeObject *)op;
    if (compact->utf8 != NULL) {
        size += compact->utf8_length + 1;
    }
    return size;
}

/* Roughly sys.getsizeof(op); -1 with an exception set on failure. */
static Py_ssize_t
size_of(PyObject *op, enum kind k)
{
    PyTypeObject *tp = Py_TYPE(op);
    Py_ssize_t size;
    switch (k) {
    case K_STR:
        size = tp == &PyUnicode_Type ? compact_str_size(op)
                                     : call_sizeof(str_sizeof, op);
        break;
    case K_LIST:
        size = tp->tp_basicsize
               + ((PyListObject *)op)->allocated * (Py_ssize_t)sizeof(PyObject *);
        break;
    case K_NUMBER:
        if (PyLong_Check(op)) {
            size = call_sizeof(int_sizeof, op);
            break;
        }
        /* fall through: float and complex have a fixed size */
    case K_TUPLE:
    case K_BYTES:
    case K_INSTANCE:
    case K_SKIP: {
        size = tp->tp_basicsize;
        if (tp->tp_itemsize != 0) {
            Py_ssize_t items = Py_SIZE(op);
            size += (items < 0 ? -items : items) * tp->tp_itemsize;
        }
        break;
    }
    case K_DICT:
        size = call_sizeof(dict_sizeof, op);
        break;
    case K_SET:
        size = call_sizeof(PyFrozenSet_Check(op) ? frozenset_sizeof : set_sizeof, op);
        break;
    default:
        size = tp->tp_basicsize;
    }
    if (size < 0) return -1;
    if (PyType_IS_GC(tp)) size += GC_HEADER_SIZE;
    if (tp->tp_flags & (Py_TPFLAGS_MANAGED_DICT | Py_TPFLAGS_MANAGED_WEAKREF)) {
        size += MANAGED_PREHEADER_SIZE;
    }
    return size;
}

#if TUPLE_HASH_CACHED
/* Whether hashing this tuple runs only builtin hash functions. */
static int
hashes_as_builtin(PyObject *op, int depth)
{
    if (depth > 16) return 0;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(op); i++) {
        PyObject *item = PyTuple_GET_ITEM(op, i);
        PyTypeObject *tp = Py_TYPE(item);
        if (is_leaf(item) || item == Py_None || tp == &PyBool_Type
            || tp == &PyFrozenSet_Type) {
            continue;
        }
        if (tp == &PyTuple_Type && hashes_as_builtin(item, depth + 1)) continue;
        return 0;
    }
    return 1;
}
#endif

/* Cache what a read would otherwise compute and store: the hash, and the
   UTF-8 form of non-ASCII text. -1 on MemoryError. */
static int
prepare(PyObject *op, enum kind k, int utf8)
{
    if (k == K_STR) {
        (void)PyUnicode_Type.tp_hash(op);
        if (utf8 && !PyUnicode_IS_ASCII(op) && PyUnicode_AsUTF8AndSize(op, NULL) == NULL) {
            /* Lone surrogates have no UTF-8 form; nothing to cache. */
            if (!PyErr_ExceptionMatches(PyExc_UnicodeEncodeError)) return -1;
            PyErr_Clear();
        }
    }
    else if (k == K_BYTES) {
        (void)PyBytes_Type.tp_hash(op);
    }
    else if (k == K_SET && PyFrozenSet_Check(op)) {
        (void)PyFrozenSet_Type.tp_hash(op);
    }
#if TUPLE_HASH_CACHED
    else if (Py_TYPE(op) == &PyTuple_Type && hashes_as_builtin(op, 0)) {
        if (PyTuple_Type.tp_hash(op) == -1 && PyErr_Occurred()) return -1;
    }
#endif
    return 0;
}


/* ---- growable arrays -------------------------------------------------------- */

/* Grow *items (of `size` bytes each) to hold at least need; -1 on MemoryError. */
static int
reserve(void **items, size_t size, Py_ssize_t *cap, Py_ssize_t need)
{
    if (need <= *cap) return 0;
    Py_ssize_t grown = *cap ? *cap : 1024;
    while (grown < need) grown *= 2;
    void *more = PyMem_Realloc(*items, (size_t)grown * size);
    if (more == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    *items = more;
    *cap = grown;
    return 0;
}

/* {type: count} += 1 for type(op); -1 on MemoryError. */
static int
count_type(PyObject *counts, PyObject *op)
{
    PyObject *tp = (PyObject *)Py_TYPE(op);
    PyObject *old = PyDict_GetItemWithError(counts, tp);
    if (old == NULL && PyErr_Occurred()) return -1;
    PyObject *new = PyLong_FromSsize_t(old == NULL ? 1 : PyLong_AsSsize_t(old) + 1);
    if (new == NULL) return -1;
    int status = PyDict_SetItem(counts, tp, new);
    Py_DECREF(new);
    return status;
}


/* ---- the walk ---------------------------------------------------------------- */

/* F_KEEP: a root that was immortal before the walk: looked inside, left as it was.
   F_OWNED: reached from a C seed through C objects and containers (spread_down).
   F_HOLDS: a seed because of what it holds (a frame), not of its type: mortality
   spreads up from it, never down (it owns no C state of its own).
   F_ASKED: kept mortal by the application (forkserve.keep_mortal): a seed,
   and so is everything it holds but modules, classes, functions and code. */
enum { F_SEED = 1, F_MORTAL = 2, F_STOP = 4, F_KEEP = 8, F_OWNED = 16, F_HOLDS = 32,
       F_ASKED = 64 };

/* How many of the seeds that kept the most objects mortal are reported. */
#define LEADERS 3

typedef struct {
    int heap;               /* share_heap(): every kind; walk(): data kinds */
    int marking;            /* 0: hash_only() */
    int utf8;
    known_types known;      /* the caller's named types */
    PyObject *skipped;      /* walk(): {type: count} of what it does not go into */
    /* nodes */
    PyObject **node_op;
    uint64_t *node_word;    /* the reference count word before the walk */
    uint8_t *node_flags;
    uint32_t *node_parents; /* first recorded edge into the node, + 1; 0: none */
    Py_ssize_t nodes, node_cap, flags_cap, parents_cap, word_cap;
    /* edges child <- parent, as singly linked lists per child */
    uint32_t *edge_parent, *edge_next;
    Py_ssize_t edges, edge_cap, edge_next_cap;
    Py_ssize_t current;     /* the node being looked inside, or -1 */
    BitSet seen;            /* hash_only()'s visited mark */
    Py_ssize_t objects, bytes;
    /* the seeds that kept the most nodes mortal, and how many (0: none) */
    Py_ssize_t leader[LEADERS], leader_kept[LEADERS];
} walk_state;

static inline uint64_t
word_of(PyObject *op)
{
    uint64_t word;
    memcpy(&word, op, sizeof(word));
    return word;
}

static inline void
set_word(PyObject *op, uint64_t word)
{
    memcpy(op, &word, sizeof(word));
}

/* The node index of op, or -1 if op is not a node of this walk. */
static inline Py_ssize_t
node_index(walk_state *w, PyObject *op)
{
    uint64_t word = word_of(op);
    Py_ssize_t index = (Py_ssize_t)(word >> 32) - 1;
    if (index >= 0 && index < w->nodes && w->node_op[index] == op) return index;
    return -1;
}

#if CHECKED
static void
make_immortal(PyObject *op)
{
#if PY_VERSION_HEX >= 0x030E0000
    _Py_SetImmortalUntracked(op);
#else
    set_word(op, (uint64_t)IMMORTAL_LOW);
#endif
}
#endif

static int
record_edge(walk_state *w, Py_ssize_t child)
{
    Py_ssize_t parent = w->current;
    if (parent < 0 || (w->node_flags[parent] & F_STOP)) return 0;
    /* A module, class, function or code object is mortal only as a seed. */
    if ((w->node_flags[child] & (F_STOP | F_SEED)) == F_STOP) return 0;
    if (reserve((void **)&w->edge_parent, sizeof(uint32_t), &w->edge_cap, w->edges + 1) < 0
        || reserve((void **)&w->edge_next, sizeof(uint32_t), &w->edge_next_cap,
                   w->edges + 1) < 0) {
        return -1;
    }
    w->edge_parent[w->edges] = (uint32_t)parent;
    w->edge_next[w->edges] = w->node_parents[child];
    w->node_parents[child] = (uint32_t)(++w->edges);
    return 0;
}

/* Append op to the nodes (tagging it when marking); -1 on MemoryError. */
static int
add_node(walk_state *w, PyObject *op)
{
    Py_ssize_t n = w->nodes + 1;
    if (n >= ((Py_ssize_t)1 << 32) - 1) {
        PyErr_SetString(PyExc_MemoryError, "more than 2**32 objects to walk");
        return -1;
    }
    if (reserve((void **)&w->node_op, sizeof(PyObject *), &w->node_cap, n) < 0
        || reserve((void **)&w->node_word, sizeof(uint64_t), &w->word_cap, n) < 0
        || reserve((void **)&w->node_flags, sizeof(uint8_t), &w->flags_cap, n) < 0
        || reserve((void **)&w->node_parents, sizeof(uint32_t), &w->parents_cap, n) < 0) {
        return -1;
    }
    Py_ssize_t size = size_of(op, classify(op));  /* here, while op is in the cache */
    if (size < 0) return -1;
    w->bytes += size;
    w->objects++;
    Py_ssize_t index = w->nodes;
    w->node_op[index] = op;
    w->node_word[index] = word_of(op);
    w->node_flags[index] = 0;
    w->node_parents[index] = 0;
    w->nodes = n;
#if CHECKED
    if (w->marking) set_word(op, ((uint64_t)n << 32) | IMMORTAL_LOW);
#endif
    if (w->marking) {
        int seed = is_seed(op, &w->known);
        if (seed < 0) return -1;
        if (seed) w->node_flags[index] |= F_SEED;
        if (is_stop(op)) w->node_flags[index] |= F_STOP;
        if (record_edge(w, index) < 0) return -1;
    }
    return 0;
}

/* Visit an object found inside the node being looked at (also a
   tp_traverse visitproc). */
static int
visit(PyObject *op, void *arg)
{
    walk_state *w = (walk_state *)arg;
    if (op == NULL) return 0;
    if (w->marking) {
        Py_ssize_t index = node_index(w, op);
        if (index >= 0) return record_edge(w, index);
#if CHECKED
        if (_Py_IsImmortal(op)) return 0;
#endif
    }
    enum kind k = classify(op);
    if (w->heap) {
        if (PyFrame_Check(op)) {
            /* Never a node (a running frame's object is reused as its
               function returns); what holds one (a traceback, an exception
               through it) stays mortal, so that dropping it frees the
               frame's locals (an open file). */
            if (w->current >= 0 && w->marking) w->node_flags[w->current] |= F_HOLDS;
            return 0;
        }
    }
    else if (k == K_SKIP) {
        if (!w->marking || is_stop(op)) return 0;  /* a class is not data, nor skipped */
        if (w->current >= 0) {
            int seed = is_seed(op, &w->known);
            if (seed < 0) return -1;
            if (seed || (PyObject_IS_GC(op) && !is_stop(op))) {
                w->node_flags[w->current] |= F_SEED;
            }
        }
        return count_type(w->skipped, op);
    }
    if (k == K_STR && w->marking && PyUnicode_CHECK_INTERNED(op)) return 0;
    if (!w->marking) {
        int added = bitset_add_object(&w->seen, op);
        if (added < 0) PyErr_NoMemory();
        if (added <= 0) return added;
    }
    if (prepare(op, k, w->utf8) < 0) return -1;
    if (is_leaf(op)) {
        Py_ssize_t size = size_of(op, k);
        if (size < 0) return -1;
        w->bytes += size;
        w->objects++;
#if CHECKED
        if (w->marking) make_immortal(op);
#endif
        return 0;
    }
    return add_node(w, op);
}

/* Visit everything inside node `index`. */
static int
expand(walk_state *w, Py_ssize_t index)
{
    PyObject *op = w->node_op[index];
    w->current = index;
    if (w->heap && PyFunction_Check(op)) {
        /* A function is followed up from its closure, defaults and __dict__
           (what dropping the function frees), never from its globals, module
           or code: every function would then reach its module's globals. */
        PyObject *own[] = {
            PyFunction_GET_CLOSURE(op), PyFunction_GET_DEFAULTS(op),
            PyFunction_GET_KW_DEFAULTS(op), ((PyFunctionObject *)op)->func_dict,
        };
        for (size_t i = 0; i < sizeof(own) / sizeof(own[0]); i++) {
            if (visit(own[i], w) < 0) return -1;
        }
        w->current = -1;  /* the rest is walked, and records no edge */
    }
    if (w->heap && PyCode_Check(op)) {
        /* Code objects are not GC-tracked: tp_traverse knows nothing of these. */
        PyCodeObject *code = (PyCodeObject *)op;
        PyObject *parts[] = {
            code->co_consts, code->co_names, code->co_exceptiontable,
            code->co_localsplusnames, code->co_localspluskinds, code->co_filename,
            code->co_name, code->co_qualname, code->co_linetable,
        };
        for (size_t i = 0; i < sizeof(parts) / sizeof(parts[0]); i++) {
            if (visit(parts[i], w) < 0) return -1;
        }
        return 0;
    }
#if PY_VERSION_HEX >= 0x030C0000
    if (w->heap && PyType_Check(op)) {
        /* The attribute caches and specialised bytecode key on a type's
           version tag, assigned (written into the type) on first use:
           assign it here, in the master, once. */
        (void)PyUnstable_Type_AssignVersionTag((PyTypeObject *)op);
    }
#endif
    enum kind k = classify(op);
    /* PyDict_Next because tp_traverse skips a dict's str keys. */
    if (PyDict_Check(op)) {
        Py_ssize_t pos = 0;
        PyObject *key, *value;
        while (PyDict_Next(op, &pos, &key, &value)) {
            if (visit(key, w) < 0 || visit(value, w) < 0) return -1;
        }
    }
    else if (!w->heap && (k == K_LIST || k == K_TUPLE)) {
        Py_ssize_t n = Py_SIZE(op);
        PyObject **items = k == K_LIST ? ((PyListObject *)op)->ob_item
                                       : ((PyTupleObject *)op)->ob_item;
        for (Py_ssize_t i = 0; i < n; i++) {
            if (visit(items[i], w) < 0) return -1;
        }
    }
    PyTypeObject *tp = Py_TYPE(op);
    traverseproc traverse = tp->tp_traverse;
    if (traverse == NULL || !PyObject_IS_GC(op)) return 0;
    if (w->heap) {
        /* What the collector would look inside, lists and tuples included
           (type_traverse must never see a static type: PyObject_IS_GC). */
        if (PyDict_CheckExact(op)) return 0;
        return traverse(op, visit, w) != 0 ? -1 : 0;
    }
    /* Sets (whose table layout is private), instances, and the extra
       __dict__ or slots of Python subclasses of the kinds above. */
    if (k == K_SET || (tp->tp_flags & Py_TPFLAGS_HEAPTYPE)) {
        return traverse(op, visit, w) != 0 ? -1 : 0;
    }
    return 0;
}

/* Give every node its word back; with done, make the immortal ones so. */
static void
settle(walk_state *w, int done)
{
    for (Py_ssize_t i = 0; i < w->nodes; i++) {
        PyObject *op = w->node_op[i];
#if defined(__GNUC__)
        /* The nodes lie all over the heap: fetch the headers a few ahead. */
        if (i + 16 < w->nodes) __builtin_prefetch(w->node_op[i + 16], 1);
#endif
        if (w->marking) set_word(op, w->node_word[i]);
        if (!done) continue;
        if (w->node_flags[i] & (F_MORTAL | F_KEEP)) {
            /* Counted as it was found: not made immortal after all. */
            Py_ssize_t size = size_of(op, classify(op));
            if (size < 0) {
                PyErr_Clear();  /* a weight is not worth failing the whole walk over */
                size = 0;
            }
            w->bytes -= size;
            w->objects--;
            continue;
        }
#if CHECKED
        if (w->marking) make_immortal(op);
#endif
    }
}

/* {type: count} of the nodes left mortal, and of the seeds among them. Only
   once every node has its final count: a dict's reference to a type still
   tagged would be lost. */
static int
count_mortal(walk_state *w, PyObject *mortal, PyObject *seeds)
{
    for (Py_ssize_t i = 0; i < w->nodes; i++) {
        uint8_t flags = w->node_flags[i];
        if ((flags & (F_MORTAL | F_KEEP)) != F_MORTAL) continue;
        if (count_type(mortal, w->node_op[i]) < 0
            || ((flags & (F_SEED | F_HOLDS)) && count_type(seeds, w->node_op[i]) < 0)) {
            return -1;
        }
    }
    return 0;
}

/* The nodes of a C seed's own state: from a seed of a C type (a sqlite
   connection, a file), every C object and container it reaches through C
   objects and containers, but no Python class's instance, function, class,
   module or generator. They die with it as they would without sharing: a
   sqlite connection's cached statements keep its database file open until
   they are freed. Never from a Python object's or a generator's seed, whose
   children are the application's data. */
typedef struct {
    walk_state *w;
    uint32_t *todo;
    Py_ssize_t pending;
    int asked;
} down_state;

static int
is_python_instance(PyObject *op)
{
    return Py_TYPE(op)->tp_dealloc == python_class_dealloc;
}

static int
runs_python(PyObject *op)
{
    return is_python_instance(op) || PyFunction_Check(op) || PyGen_Check(op)
           || PyCoro_CheckExact(op) || PyAsyncGen_CheckExact(op);
}

static int
down_visit(PyObject *op, void *arg)
{
    down_state *d = (down_state *)arg;
    if (op == NULL) return 0;
    Py_ssize_t index = node_index(d->w, op);
    if (index < 0 || (d->w->node_flags[index] & (F_OWNED | F_STOP))
        || (d->asked ? PyFunction_Check(op) : runs_python(op))) {
        return 0;
    }
    d->w->node_flags[index] |= F_OWNED | F_MORTAL;
    d->todo[d->pending++] = (uint32_t)index;
    return 0;
}

/* From the C seeds through C objects and containers (asked 0), or from the
   asked nodes through everything but modules, classes, functions and code
   (asked 1). */
static void
spread_down(walk_state *w, uint32_t *todo, int asked)
{
    down_state d = {w, todo, 0, asked};
    for (Py_ssize_t i = 0; i < w->nodes; i++) {
        int from = asked ? (w->node_flags[i] & F_ASKED)
                         : ((w->node_flags[i] & F_SEED) && !runs_python(w->node_op[i]));
        if (from && !(w->node_flags[i] & F_OWNED)) {
            w->node_flags[i] |= F_OWNED;
            todo[d.pending++] = (uint32_t)i;
        }
    }
    while (d.pending > 0) {
        PyObject *op = w->node_op[todo[--d.pending]];
        traverseproc traverse = Py_TYPE(op)->tp_traverse;
        if (PyDict_Check(op)) {  /* tp_traverse may skip a dict's keys */
            Py_ssize_t pos = 0;
            PyObject *key, *value;
            while (PyDict_Next(op, &pos, &key, &value)) {
                (void)down_visit(key, &d);
                (void)down_visit(value, &d);
            }
        }
        else if (traverse != NULL && PyObject_IS_GC(op)) {
            (void)traverse(op, down_visit, &d);
        }
    }
}

/* Keep the LEADERS seeds that kept the most nodes mortal, most first. */
static void
note_leader(walk_state *w, Py_ssize_t index, Py_ssize_t kept)
{
    int at = LEADERS;
    while (at > 0 && kept > w->leader_kept[at - 1]) at--;
    if (at == LEADERS) return;
    for (int j = LEADERS - 1; j > at; j--) {
        w->leader[j] = w->leader[j - 1];
        w->leader_kept[j] = w->leader_kept[j - 1];
    }
    w->leader[at] = index;
    w->leader_kept[at] = kept;
}

/* Mortality: every seed, every node from which a seed is reachable through
   recorded edges, and the state C seeds own (spread_down). */
static int
spread_mortality(walk_state *w)
{
    uint32_t *todo = PyMem_Malloc((size_t)(w->nodes ? w->nodes : 1) * sizeof(uint32_t));
    if (todo == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    /* Seed by seed, so that each mortal node is counted for the first seed
       that reaches it: the leaders are the seeds that kept the most. */
    for (Py_ssize_t i = 0; i < w->nodes; i++) {
        if (!(w->node_flags[i] & (F_SEED | F_HOLDS | F_ASKED)) || (w->node_flags[i] & F_MORTAL)) {
            continue;
        }
        w->node_flags[i] |= F_MORTAL;
        Py_ssize_t pending = 0, kept = 1;
        todo[pending++] = (uint32_t)i;
        while (pending > 0) {
            uint32_t child = todo[--pending];
            for (uint32_t edge = w->node_parents[child]; edge != 0;
                 edge = w->edge_next[edge - 1]) {
                uint32_t parent = w->edge_parent[edge - 1];
                if (!(w->node_flags[parent] & F_MORTAL)) {
                    w->node_flags[parent] |= F_MORTAL;
                    todo[pending++] = parent;
                    kept++;
                }
            }
        }
        note_leader(w, i, kept);
    }
    /* each node is pushed once in each: todo has room for all */
    spread_down(w, todo, 1);
    spread_down(w, todo, 0);
    PyMem_Free(todo);
    return 0;
}

static void
free_state(walk_state *w)
{
    PyMem_Free(w->node_op);
    PyMem_Free(w->node_word);
    PyMem_Free(w->node_flags);
    PyMem_Free(w->node_parents);
    PyMem_Free(w->edge_parent);
    PyMem_Free(w->edge_next);
    bitset_free(&w->seen);
}

/* [(seed, objects it kept mortal)], most first. Only once every node has its
   final word: a seed is an ordinary object again. */
static PyObject *
leaders_of(walk_state *w)
{
    PyObject *leaders = PyList_New(0);
    for (int i = 0; leaders != NULL && i < LEADERS && w->leader_kept[i] > 0; i++) {
        PyObject *pair = Py_BuildValue("(On)", w->node_op[w->leader[i]], w->leader_kept[i]);
        if (pair == NULL || PyList_Append(leaders, pair) < 0) Py_CLEAR(leaders);
        Py_XDECREF(pair);
    }
    return leaders;
}

/* Walk from the roots (the root's own node is looked inside even if it was
   already immortal, for walk()), settle, and build the result. */
/* Flag the nodes the application asked to keep mortal (a module: its
   globals' dict). */
static void
flag_asked(walk_state *w, PyObject *asked)
{
    for (Py_ssize_t i = 0; asked != NULL && i < PyList_GET_SIZE(asked); i++) {
        PyObject *op = PyList_GET_ITEM(asked, i);
        if (PyModule_Check(op)) op = PyModule_GetDict(op);
        Py_ssize_t index = op != NULL ? node_index(w, op) : -1;
        if (index >= 0) w->node_flags[index] |= F_ASKED;
    }
}

static PyObject *
run(walk_state *w, PyObject *const *roots, Py_ssize_t nroots, PyObject *skip,
    PyObject *asked)
{
    PyObject *mortal = PyDict_New(), *seeds = PyDict_New();
    w->skipped = PyDict_New();
    int status = (mortal == NULL || seeds == NULL || w->skipped == NULL) ? -1 : 0;
    w->current = -1;
    for (Py_ssize_t i = 0; status == 0 && i < nroots; i++) {
        PyObject *root = roots[i];
        if (root == skip) continue;
#if CHECKED
        if (!w->heap && w->marking && _Py_IsImmortal(root) && node_index(w, root) < 0) {
            /* Already shared: not counted again, but looked inside. */
            enum kind k = classify(root);
            if (k == K_SKIP || is_leaf(root)) continue;
            Py_ssize_t before = w->nodes;
            status = add_node(w, root);
            if (status == 0) w->node_flags[before] |= F_KEEP;
            continue;
        }
#endif
        if (!w->heap && classify(root) == K_SKIP) {
            status = count_type(w->skipped, root);
            continue;
        }
        status = visit(root, w);
    }
    for (Py_ssize_t i = 0; status == 0 && i < w->nodes; i++) {
        status = expand(w, i);
    }
    w->current = -1;
    if (status == 0 && w->marking) {
        flag_asked(w, asked);
        status = spread_mortality(w);
    }
    settle(w, status == 0);
    if (status == 0 && w->marking) status = count_mortal(w, mortal, seeds);
    PyObject *leaders = status == 0 ? leaders_of(w) : NULL;
    free_state(w);
    PyObject *result = leaders != NULL
        ? Py_BuildValue("(nnOOOO)", w->objects, w->bytes, mortal, seeds, w->skipped, leaders)
        : NULL;
    Py_XDECREF(leaders);
    Py_XDECREF(mortal);
    Py_XDECREF(seeds);
    Py_XDECREF(w->skipped);
    return result;
}


/* ---- the module ------------------------------------------------------------- */

#if CHECKED
/* Parse the (resources, plain, zoned) tuple of tuples of types into w. */
static int
known_arg(walk_state *w, PyObject *known)
{
    const char *message = "known types must be (resources, plain, zoned), tuples of types";
    if (!PyTuple_Check(known) || PyTuple_GET_SIZE(known) != 3) {
        PyErr_SetString(PyExc_TypeError, message);
        return -1;
    }
    for (Py_ssize_t i = 0; i < 3; i++) {
        PyObject *types = PyTuple_GET_ITEM(known, i);
        if (!PyTuple_Check(types)) {
            PyErr_SetString(PyExc_TypeError, message);
            return -1;
        }
        for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(types); j++) {
            if (!PyType_Check(PyTuple_GET_ITEM(types, j))) {
                PyErr_SetString(PyExc_TypeError, message);
                return -1;
            }
        }
    }
    w->known.resources = PyTuple_GET_ITEM(known, 0);
    w->known.plain = PyTuple_GET_ITEM(known, 1);
    w->known.zoned = PyTuple_GET_ITEM(known, 2);
    return 0;
}

PyDoc_STRVAR(walk_doc,
"walk(root, known, utf8, /) -> (objects, bytes, mortal, seeds, skipped, leaders)\n\n"
"Make everything a dataset reachable from root is made of immortal, but\n"
"for what the mortality rule keeps mortal. known: (resources, plain, zoned),\n"
"tuples of types (forkserve.memory.sharing.known_types()). utf8: also cache the UTF-8\n"
"form of non-ASCII str. Use forkserve.share(), which probes first.");

static PyObject *
walk(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "walk() takes (root, known, utf8)");
        return NULL;
    }
    walk_state w = {0};
    if (known_arg(&w, args[1]) < 0) return NULL;
    w.marking = 1;
    w.utf8 = PyObject_IsTrue(args[2]);
    if (w.utf8 < 0) return NULL;
    return run(&w, args, 1, NULL, NULL);
}

PyDoc_STRVAR(share_heap_doc,
"share_heap(roots, known, utf8, asked, /) -> (objects, bytes, mortal, seeds, skipped, leaders)\n\n"
"As walk(), for every object reachable from the items of the list roots, of\n"
"every kind; the items of the list asked (a module: its globals) stay mortal\n"
"with everything they hold but modules, classes, functions and code. Use\n"
"forkserve.memory.heap.share_heap().");

static PyObject *
share_heap(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 4 || !PyList_CheckExact(args[0]) || !PyList_CheckExact(args[3])) {
        PyErr_SetString(PyExc_TypeError,
                        "share_heap() takes (list of roots, known, utf8, list kept mortal)");
        return NULL;
    }
    walk_state w = {0};
    if (known_arg(&w, args[1]) < 0) return NULL;
    w.heap = 1;
    w.marking = 1;
    w.utf8 = PyObject_IsTrue(args[2]);
    if (w.utf8 < 0) return NULL;
    PyObject *roots = args[0];
    /* The list itself is never marked: marking it would leak it. */
    return run(&w, ((PyListObject *)roots)->ob_item, PyList_GET_SIZE(roots), roots, args[3]);
}

PyDoc_STRVAR(mark_doc,
"mark(objects, /) -> words\n\n"
"Prepare each item of the list objects and make it immortal as the walks\n"
"do; return their reference count words as they were. For the probe.");

static PyObject *
mark(PyObject *module, PyObject *objects)
{
    (void)module;
    if (!PyList_CheckExact(objects)) {
        PyErr_SetString(PyExc_TypeError, "mark() takes a list");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(objects);
    PyObject *words = PyList_New(n);
    if (words == NULL) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *op = PyList_GET_ITEM(objects, i);
        PyObject *word = PyLong_FromUnsignedLongLong(word_of(op));
        if (word == NULL || prepare(op, classify(op), 1) < 0) {
            Py_XDECREF(word);
            Py_DECREF(words);
            return NULL;
        }
        PyList_SET_ITEM(words, i, word);
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        make_immortal(PyList_GET_ITEM(objects, i));
    }
    return words;
}

PyDoc_STRVAR(restore_doc,
"restore(objects, words, /)\n\n"
"Give each item of the list objects back the word mark() returned for it:\n"
"ordinary objects again. Only for what mark() marked, with no reference\n"
"taken or dropped in between.");

static PyObject *
restore(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 2 || !PyList_CheckExact(args[0]) || !PyList_CheckExact(args[1])
        || PyList_GET_SIZE(args[0]) != PyList_GET_SIZE(args[1])) {
        PyErr_SetString(PyExc_TypeError, "restore() takes (objects, words), two lists");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(args[0]); i++) {
        unsigned long long word = PyLong_AsUnsignedLongLong(PyList_GET_ITEM(args[1], i));
        if (word == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
        set_word(PyList_GET_ITEM(args[0], i), (uint64_t)word);
    }
    Py_RETURN_NONE;
}
#endif

/* ---- the probe's fork ------------------------------------------------------- */

/* Seconds on the monotonic clock. */
static double
monotonic_now(void)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)now.tv_sec + (double)now.tv_nsec / 1e9;
}

/* In the parent: read the child's answer into buffer (what does not fit is
   read and dropped) until it closes the pipe or the deadline passes. Runs
   without the GIL. Returns 1 if the deadline passed, 0 at end of file, -1
   with errno set on a read or poll error. */
static int
read_answer(int fd, char *buffer, size_t size, size_t *length, double deadline)
{
    char scratch[512];
    for (;;) {
        double left = deadline - monotonic_now();
        if (left <= 0) return 1;
        struct pollfd wait = {.fd = fd, .events = POLLIN};
        int ready = poll(&wait, 1, (int)(left * 1000) + 1);
        if (ready < 0 && errno == EINTR) continue;
        if (ready < 0) return -1;
        if (ready == 0) continue;  /* the deadline is checked above */
        char *into = *length < size ? buffer + *length : scratch;
        size_t room = *length < size ? size - *length : sizeof(scratch);
        ssize_t got = read(fd, into, room);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) return -1;
        if (got == 0) return 0;
        if (into == buffer + *length) *length += (size_t)got;
    }
}

PyDoc_STRVAR(probe_fork_doc,
"probe_fork(child, timeout, /) -> (answer, timed_out)\n\n"
"Fork with the C library's fork(): none of the hooks registered with\n"
"os.register_at_fork run, in this process or the child (gevent's neither).\n"
"The child calls child(fd), fd the write end of a pipe, and leaves with\n"
"_exit(). The parent reads what the child writes (at most 4 KiB kept) until\n"
"it closes the pipe or timeout seconds pass, then kills a child still\n"
"running, reaps it, and returns the bytes and whether the time ran out.\n"
"OSError if pipe() or fork() fails. For forkserve.memory.probe.");

static PyObject *
probe_fork(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 2 || !PyCallable_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "probe_fork() takes (callable, timeout)");
        return NULL;
    }
    double timeout = PyFloat_AsDouble(args[1]);
    if (timeout == -1.0 && PyErr_Occurred()) return NULL;
    if (!(timeout > 0 && timeout < 3600)) {
        PyErr_SetString(PyExc_ValueError, "probe_fork(): timeout must be 0-3600 seconds");
        return NULL;
    }
    int fds[2];
    if (pipe(fds) < 0) return PyErr_SetFromErrno(PyExc_OSError);
    pid_t pid = fork();
    if (pid < 0) {
        int saved = errno;
        close(fds[0]);
        close(fds[1]);
        errno = saved;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    if (pid == 0) {
        /* The child: this thread still holds the GIL, and no other thread
           exists; the callable imports nothing and takes no lock. */
        close(fds[0]);
        PyObject *fd = PyLong_FromLong(fds[1]);
        PyObject *result = fd != NULL ? PyObject_CallOneArg(args[0], fd) : NULL;
        _exit(result != NULL ? 0 : 1);
    }
    close(fds[1]);
    char answer[4096];
    size_t length = 0;
    int outcome, saved = 0;
    Py_BEGIN_ALLOW_THREADS
    outcome = read_answer(fds[0], answer, sizeof(answer), &length,
                          monotonic_now() + timeout);
    saved = errno;
    if (outcome != 0) kill(pid, SIGKILL);
    close(fds[0]);
    while (waitpid(pid, NULL, 0) < 0 && errno == EINTR) {
    }
    Py_END_ALLOW_THREADS
    if (outcome < 0) {
        errno = saved;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return Py_BuildValue("(y#O)", answer, (Py_ssize_t)length,
                         outcome == 1 ? Py_True : Py_False);
}

PyDoc_STRVAR(hash_only_doc,
"hash_only(root, utf8, /) -> (objects, bytes, {}, {}, {}, [])\n\n"
"Cache the hashes (and UTF-8 forms) of the dataset reachable from root;\n"
"mark nothing. For the interpreters marking is not checked on.");

static PyObject *
hash_only(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "hash_only() takes (root, utf8)");
        return NULL;
    }
    walk_state w = {0};
    w.utf8 = PyObject_IsTrue(args[1]);
    if (w.utf8 < 0) return NULL;
    if (bitset_init(&w.seen, 64) < 0) return PyErr_NoMemory();
    return run(&w, args, 1, NULL, NULL);
}

PyDoc_STRVAR(refcnt_doc,
"refcnt(obj, /) -> int\n\n"
"The raw reference count word of obj (counting this call's references).");

static PyObject *
refcnt(PyObject *module, PyObject *op)
{
    (void)module;
    return PyLong_FromUnsignedLongLong(word_of(op));
}

PyDoc_STRVAR(is_immortal_doc,
"is_immortal(obj, /) -> bool\n\n"
"Whether the interpreter treats obj as immortal: its count, and from 3.14\n"
"also the immortal bit of ob_flags that stack references read.");

static PyObject *
is_immortal_py(PyObject *module, PyObject *op)
{
    (void)module;
#if CHECKED && PY_VERSION_HEX >= 0x030E0000
    return PyBool_FromLong(_Py_IsImmortal(op) && (op->ob_flags & 1));
#elif CHECKED
    return PyBool_FromLong(_Py_IsImmortal(op));
#else
    (void)op;
    Py_RETURN_FALSE;
#endif
}

static PyMethodDef methods[] = {
#if CHECKED
    {"walk", (PyCFunction)(void (*)(void))walk, METH_FASTCALL, walk_doc},
    {"share_heap", (PyCFunction)(void (*)(void))share_heap, METH_FASTCALL, share_heap_doc},
    {"mark", mark, METH_O, mark_doc},
    {"restore", (PyCFunction)(void (*)(void))restore, METH_FASTCALL, restore_doc},
#endif
    {"hash_only", (PyCFunction)(void (*)(void))hash_only, METH_FASTCALL, hash_only_doc},
    {"probe_fork", (PyCFunction)(void (*)(void))probe_fork, METH_FASTCALL, probe_fork_doc},
    {"refcnt", refcnt, METH_O, refcnt_doc},
    {"is_immortal", is_immortal_py, METH_O, is_immortal_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = MODULE_DEF(
    "forkserve.memory._immortal",
    "The walker behind forkserve.share() and --share-heap; see forkserve/memory/sharing.py.",
    methods);

static PyObject *
sizeof_method(PyTypeObject *tp)
{
    return PyObject_GetAttrString((PyObject *)tp, "__sizeof__");
}

/* subtype_dealloc, read off a class made here (and then dropped). */
static destructor
read_python_class_dealloc(void)
{
    PyObject *cls = PyObject_CallFunction((PyObject *)&PyType_Type, "s()N",
                                          "_forkserve_probe_class", PyDict_New());
    if (cls == NULL) return NULL;
    destructor dealloc = ((PyTypeObject *)cls)->tp_dealloc;
    Py_DECREF(cls);
    return dealloc;
}

/* CHECKED: this build marks objects (walk, share_heap, mark exist). */
static int
add_checked(PyObject *module)
{
    return PyModule_AddIntConstant(module, "CHECKED", CHECKED);
}

PyMODINIT_FUNC
PyInit__immortal(void)
{
    if (dict_sizeof == NULL) {
        dict_sizeof = sizeof_method(&PyDict_Type);
        set_sizeof = sizeof_method(&PySet_Type);
        frozenset_sizeof = sizeof_method(&PyFrozenSet_Type);
        int_sizeof = sizeof_method(&PyLong_Type);
        str_sizeof = sizeof_method(&PyUnicode_Type);
        python_class_dealloc = read_python_class_dealloc();
        if (!dict_sizeof || !set_sizeof || !frozenset_sizeof || !int_sizeof
            || !str_sizeof || !python_class_dealloc) {
            Py_CLEAR(dict_sizeof);
            Py_CLEAR(set_sizeof);
            Py_CLEAR(frozenset_sizeof);
            Py_CLEAR(int_sizeof);
            Py_CLEAR(str_sizeof);
            return NULL;
        }
    }
    return module_create(&module_def, add_checked);
}
