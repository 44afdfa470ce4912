/* forkserve._immortal: the fast walker behind forkserve.share().
 *
 * walk(root, immortal, utf8) visits every object reachable from root through
 * the kinds share() understands (dict keys and values, list, tuple, set,
 * frozenset, str, bytes, int, float, and the attributes of instances of
 * Python classes with a __dict__), and prepares each one so that reading it
 * in a forked worker writes nothing:
 *   - str, bytes and frozenset get their hash computed and cached;
 *   - non-ASCII str get their UTF-8 form cached when `utf8` is true;
 *   - when `immortal` is an int, it is written into the reference count.
 * It returns (objects, bytes): how many objects it prepared and roughly what
 * sys.getsizeof() says they weigh.
 *
 * Invariants, and why they hold:
 * - No Python code runs during a walk and nothing releases the GIL: we call
 *   only C functions of builtin types (hashes, __sizeof__ of dict/set/int/str,
 *   tp_traverse) and allocate no GC-tracked object, so no collection, no
 *   finalizer and no other thread can change or free an object under us. We
 *   therefore take no references to what we visit.
 * - Immortal mode: the immortal reference count is the visited mark, so an
 *   object already immortal (None, small ints, interned and static strings,
 *   or anything an earlier walk marked) is skipped and not looked inside. The
 *   root is the exception: it is always looked inside, so share(x) after
 *   adding to x reaches the additions.
 * - Interned strings belong to the interpreter, whose finalization has its
 *   own bookkeeping for them (3.13 keeps mortal interned strings), so they
 *   are never marked; their hash is cached already.
 * - Containers are appended to `queue` as they are marked, with the
 *   reference count they had; the queue is both the work list (breadth
 *   first, no recursion, so depth is unlimited) and an undo log. If anything
 *   fails (MemoryError), every queued container gets its old count back
 *   before the error propagates, so no container stays marked without having
 *   been looked inside and a later share() can finish the job. Leaves that
 *   were marked (str, bytes, numbers) are complete and stay marked.
 * - Hash-only mode (immortal is None: Python 3.11, or a failed probe) marks
 *   nothing; an address bitmap records what was visited.
 *
 * The caller (forkserve/share.py) decides whether immortal mode is safe: it
 * takes the value from Py_REFCNT(Py_None) and probes it first.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#ifdef Py_GIL_DISABLED
#error "forkserve._immortal does not support free-threaded builds (share() falls back to Python)"
#endif

#define IMMORTAL_OBJECTS (PY_VERSION_HEX >= 0x030C0000)

#ifndef Py_TPFLAGS_MANAGED_DICT
#define Py_TPFLAGS_MANAGED_DICT 0
#endif
#ifndef Py_TPFLAGS_MANAGED_WEAKREF
#define Py_TPFLAGS_MANAGED_WEAKREF 0
#endif

/* sys.getsizeof() adds the GC header (two pointers) of GC types and, from
   3.11, the two pointers before a managed dict or weakref. */
#define GC_HEADER_SIZE (2 * (Py_ssize_t)sizeof(void *))
#define MANAGED_PREHEADER_SIZE (2 * (Py_ssize_t)sizeof(void *))

/* __sizeof__ of the builtin types whose storage lives outside the object and
   has no public layout (dict keys, set tables, int digits, str subclasses'
   data). Borrowed from the immortal builtin types; set at import. */
static PyObject *dict_sizeof;
static PyObject *set_sizeof;
static PyObject *frozenset_sizeof;
static PyObject *int_sizeof;
static PyObject *str_sizeof;

enum kind {
    K_SKIP,      /* not ours: types, modules, functions, arbitrary objects */
    K_STR,
    K_BYTES,
    K_NUMBER,    /* int, float (and bool) */
    K_TUPLE,
    K_LIST,
    K_DICT,
    K_SET,       /* set and frozenset */
    K_INSTANCE,  /* instance of a Python class with a __dict__ */
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
    if (PyFloat_Check(op)) return K_NUMBER;
    if (PyAnySet_Check(op)) return K_SET;
    if ((flags & Py_TPFLAGS_HEAPTYPE)
        && (tp->tp_dictoffset != 0 || (flags & Py_TPFLAGS_MANAGED_DICT))
        && tp->tp_traverse != NULL
        && !PyModule_Check(op)) {
        return K_INSTANCE;
    }
    return K_SKIP;
}

/* Whether op must be queued to be looked inside: containers, and instances
   of Python subclasses of any kind (their tp_traverse reports __dict__ and
   slots). */
static int
has_children(PyObject *op, enum kind k)
{
    PyTypeObject *tp = Py_TYPE(op);
    return k >= K_TUPLE
        || ((tp->tp_flags & Py_TPFLAGS_HEAPTYPE) && tp->tp_traverse != NULL);
}


/* ---- the queue (work list and undo log) ---------------------------------- */

typedef struct {
    PyObject *op;
    Py_ssize_t refcnt;      /* before we marked it */
} entry;

typedef struct {
    entry *items;
    Py_ssize_t len, cap;
} queue;

static int
queue_push(queue *q, PyObject *op)
{
    if (q->len == q->cap) {
        Py_ssize_t cap = q->cap ? q->cap * 2 : 1024;
        entry *items = PyMem_Realloc(q->items, (size_t)cap * sizeof(entry));
        if (items == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        q->items = items;
        q->cap = cap;
    }
    q->items[q->len].op = op;
    q->items[q->len].refcnt = Py_REFCNT(op);
    q->len++;
    return 0;
}


/* ---- the address set (visited mark of hash-only mode) -------------------
 *
 * A bitmap with one bit per 16 bytes of address space, kept per MiB chunk
 * in a small hash table keyed by the chunk's address. Two distinct objects
 * are at least sizeof(PyObject) == 16 bytes apart, so they never share a
 * bit. Objects laid out one after another (as a loader makes them) land in
 * the same few chunks, so this is cache friendly where a hash set of
 * pointers misses the cache on every object: about 8 KiB per MiB of heap.
 */

#define CHUNK_SHIFT 20
#define CHUNK_WORDS ((1 << (CHUNK_SHIFT - 4)) / 64)

typedef struct {
    uintptr_t base;         /* address >> CHUNK_SHIFT */
    uint64_t *bits;         /* NULL = empty slot */
} chunk;

typedef struct {
    chunk *slots;           /* capacity is a power of two */
    Py_ssize_t used, cap;
    chunk *last;            /* the chunk of the previous lookup */
} addrset;

static size_t
chunk_slot(uintptr_t base, Py_ssize_t cap)
{
    return (size_t)(base * (uintptr_t)0x9E3779B97F4A7C15ULL) & ((size_t)cap - 1);
}

static int
addrset_grow(addrset *s)
{
    Py_ssize_t cap = s->cap ? s->cap * 2 : 64;
    chunk *slots = PyMem_Calloc((size_t)cap, sizeof(chunk));
    if (slots == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < s->cap; i++) {
        if (s->slots[i].bits == NULL) continue;
        size_t j = chunk_slot(s->slots[i].base, cap);
        while (slots[j].bits != NULL) j = (j + 1) & ((size_t)cap - 1);
        slots[j] = s->slots[i];
    }
    PyMem_Free(s->slots);
    s->slots = slots;
    s->cap = cap;
    s->last = NULL;
    return 0;
}

static chunk *
addrset_chunk(addrset *s, uintptr_t base)
{
    if (s->last != NULL && s->last->base == base) return s->last;
    if (2 * (s->used + 1) > s->cap && addrset_grow(s) < 0) return NULL;
    size_t j = chunk_slot(base, s->cap);
    while (s->slots[j].bits != NULL && s->slots[j].base != base) {
        j = (j + 1) & ((size_t)s->cap - 1);
    }
    if (s->slots[j].bits == NULL) {
        uint64_t *bits = PyMem_Calloc(CHUNK_WORDS, sizeof(uint64_t));
        if (bits == NULL) {
            PyErr_NoMemory();
            return NULL;
        }
        s->slots[j].base = base;
        s->slots[j].bits = bits;
        s->used++;
    }
    s->last = &s->slots[j];
    return s->last;
}

/* 1 if op was added, 0 if it was there, -1 on MemoryError. */
static int
addrset_add(addrset *s, PyObject *op)
{
    uintptr_t address = (uintptr_t)op;
    chunk *c = addrset_chunk(s, address >> CHUNK_SHIFT);
    if (c == NULL) return -1;
    size_t bit = (address >> 4) & ((1 << (CHUNK_SHIFT - 4)) - 1);
    uint64_t mask = (uint64_t)1 << (bit % 64);
    if (c->bits[bit / 64] & mask) return 0;
    c->bits[bit / 64] |= mask;
    return 1;
}

static void
addrset_free(addrset *s)
{
    for (Py_ssize_t i = 0; i < s->cap; i++) {
        PyMem_Free(s->slots[i].bits);
    }
    PyMem_Free(s->slots);
}


/* ---- the walk ------------------------------------------------------------- */

typedef struct {
    int immortal_mode;
    Py_ssize_t immortal;    /* the value to write, from Py_REFCNT(Py_None) */
    int utf8;
    queue queue;
    addrset seen;
    Py_ssize_t objects;
    Py_ssize_t bytes;
} walk_state;

static int
is_immortal(PyObject *op)
{
#if IMMORTAL_OBJECTS
    return _Py_IsImmortal(op);
#else
    (void)op;
    return 0;
#endif
}

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
    case K_TUPLE:
    case K_BYTES:
        size = tp->tp_basicsize + Py_SIZE(op) * tp->tp_itemsize;
        break;
    case K_NUMBER:
        size = PyLong_Check(op) ? call_sizeof(int_sizeof, op) : tp->tp_basicsize;
        break;
    case K_DICT:
#if PY_VERSION_HEX < 0x030D0000
        /* Public until 3.12 (cpython/dictobject.h); saves a call per dict. */
        size = _PyDict_SizeOf((PyDictObject *)op);
#else
        size = call_sizeof(dict_sizeof, op);
#endif
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

/* Cache what a read would otherwise compute and store: the hash, and the
   UTF-8 form of non-ASCII text. -1 on MemoryError. */
static int
prepare_leaf(walk_state *w, PyObject *op, enum kind k)
{
    if (k == K_STR) {
        (void)PyUnicode_Type.tp_hash(op);
        if (w->utf8 && !PyUnicode_IS_ASCII(op)
            && PyUnicode_AsUTF8AndSize(op, NULL) == NULL) {
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
    return 0;
}

/* Visit one object found in a container (also a tp_traverse visitproc):
   prepare it, count it, queue it if it has children, mark it. */
static int
visit(PyObject *op, void *arg)
{
    walk_state *w = (walk_state *)arg;
    if (w->immortal_mode && is_immortal(op)) return 0;

    enum kind k = classify(op);
    if (k == K_SKIP) return 0;
    if (k == K_STR && w->immortal_mode && PyUnicode_CHECK_INTERNED(op)) return 0;
    if (!w->immortal_mode) {
        int added = addrset_add(&w->seen, op);
        if (added <= 0) return added;
    }

    if (prepare_leaf(w, op, k) < 0) return -1;
    if (has_children(op, k)) {
        /* Weighed in expand(), which reads its storage anyway. */
        if (queue_push(&w->queue, op) < 0) return -1;
    }
    else {
        Py_ssize_t size = size_of(op, k);
        if (size < 0) return -1;
        w->bytes += size;
    }
#if IMMORTAL_OBJECTS
    if (w->immortal_mode) op->ob_refcnt = w->immortal;
#endif
    w->objects++;
    return 0;
}

/* Weigh a queued object and visit everything inside it. */
static int
expand(walk_state *w, PyObject *op, int counted)
{
    enum kind k = classify(op);
    if (counted) {
        Py_ssize_t size = size_of(op, k);
        if (size < 0) return -1;
        w->bytes += size;
    }
    if (k == K_DICT) {
        Py_ssize_t pos = 0;
        PyObject *key, *value;
        while (PyDict_Next(op, &pos, &key, &value)) {
            if (visit(key, w) < 0 || visit(value, w) < 0) return -1;
        }
    }
    else if (k == K_LIST || k == K_TUPLE) {
        Py_ssize_t n = Py_SIZE(op);
        PyObject **items = k == K_LIST ? ((PyListObject *)op)->ob_item
                                       : ((PyTupleObject *)op)->ob_item;
        for (Py_ssize_t i = 0; i < n; i++) {
            if (visit(items[i], w) < 0) return -1;
        }
    }
    /* Sets (whose table layout is private), instances, and the extra
       __dict__ or slots of Python subclasses of the kinds above. */
    PyTypeObject *tp = Py_TYPE(op);
    if (tp->tp_traverse != NULL
        && (k == K_SET || (tp->tp_flags & Py_TPFLAGS_HEAPTYPE))) {
        if (tp->tp_traverse(op, visit, w) != 0) return -1;
    }
    return 0;
}

static void
undo_marks(walk_state *w)
{
#if IMMORTAL_OBJECTS
    if (!w->immortal_mode) return;
    for (Py_ssize_t i = 0; i < w->queue.len; i++) {
        w->queue.items[i].op->ob_refcnt = w->queue.items[i].refcnt;
    }
#else
    (void)w;
#endif
}

static int
run_walk(walk_state *w, PyObject *root)
{
    int root_was_shared = w->immortal_mode && is_immortal(root);
    if (root_was_shared) {
        /* Already shared: not counted again, but looked inside. */
        enum kind k = classify(root);
        if (k != K_SKIP && has_children(root, k)
            && queue_push(&w->queue, root) < 0) {
            return -1;
        }
    }
    else if (visit(root, w) < 0) {
        return -1;
    }
    for (Py_ssize_t i = 0; i < w->queue.len; i++) {
        if (expand(w, w->queue.items[i].op, !root_was_shared || i > 0) < 0) {
            return -1;
        }
    }
    return 0;
}

PyDoc_STRVAR(walk_doc,
"walk(root, immortal, utf8, /) -> (objects, bytes)\n\n"
"Prepare everything reachable from root for sharing across fork().\n"
"immortal: the reference count to write (Py_REFCNT(None)), or None to only\n"
"cache hashes. utf8: also cache the UTF-8 form of non-ASCII str.\n"
"Use forkserve.share(), which checks that immortal mode is safe first.");

static PyObject *
walk(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "walk() takes (root, immortal, utf8)");
        return NULL;
    }
    walk_state w = {0};
    if (args[1] != Py_None) {
#if IMMORTAL_OBJECTS
        w.immortal_mode = 1;
        w.immortal = PyLong_AsSsize_t(args[1]);
        if (w.immortal == -1 && PyErr_Occurred()) return NULL;
#else
        PyErr_SetString(PyExc_RuntimeError,
                        "this Python has no immortal objects; pass immortal=None");
        return NULL;
#endif
    }
    w.utf8 = PyObject_IsTrue(args[2]);
    if (w.utf8 < 0) return NULL;

    int status = run_walk(&w, args[0]);
    if (status < 0) undo_marks(&w);
    PyMem_Free(w.queue.items);
    addrset_free(&w.seen);
    if (status < 0) return NULL;
    return Py_BuildValue("(nn)", w.objects, w.bytes);
}

/* ---- the whole heap (forkserve --share-heap) ------------------------------
 *
 * share_heap(roots, immortal, utf8) marks immortal every object reachable
 * from the items of the list `roots` (the caller passes sys.modules and what
 * gc.get_objects() returns), of every kind: code, functions, types, modules,
 * instances of C types, and the untracked objects they hold (str, bytes,
 * numbers, tuples). It looks inside an object with:
 *   - PyDict_Next for dicts (tp_traverse skips the str keys of a dict),
 *   - the constants, names and tables of code objects (not GC-tracked, so
 *     tp_traverse knows nothing of them),
 *   - tp_traverse for everything else the collector would look inside
 *     (PyObject_IS_GC: type_traverse must never see a static type).
 * What it never marks, and why:
 *   - the list `roots` itself (marking would leak it);
 *   - frame objects: a running frame's object is reused as the function
 *     returns; the objects its locals hold are reached through the
 *     collector's lists, or not at all if they are untracked leaves;
 *   - interned str, for the reason walk() gives above.
 * The invariants of walk() hold: no Python code runs, nothing is allocated
 * that the collector tracks, the immortal mark is the visited mark. On
 * failure (MemoryError) the containers queued so far get their counts back.
 */

#include <frameobject.h>

#if IMMORTAL_OBJECTS
static Py_ssize_t
generic_size(PyObject *op)
{
    PyTypeObject *tp = Py_TYPE(op);
    Py_ssize_t size = tp->tp_basicsize;
    if (tp->tp_itemsize != 0) {
        Py_ssize_t items = Py_SIZE(op);
        size += (items < 0 ? -items : items) * tp->tp_itemsize;
    }
    if (PyType_IS_GC(tp)) size += GC_HEADER_SIZE;
    if (tp->tp_flags & (Py_TPFLAGS_MANAGED_DICT | Py_TPFLAGS_MANAGED_WEAKREF)) {
        size += MANAGED_PREHEADER_SIZE;
    }
    return size;
}

static int
heap_visit(PyObject *op, void *arg)
{
    walk_state *w = (walk_state *)arg;
    if (op == NULL || is_immortal(op)) return 0;
    if (PyFrame_Check(op)) return 0;
    enum kind k = classify(op);
    if (k == K_STR && PyUnicode_CHECK_INTERNED(op)) return 0;

    if (prepare_leaf(w, op, k) < 0) return -1;
    if (PyType_Check(op)) {
        /* The attribute caches and specialised bytecode key on a type's
           version tag, assigned (written into the type) on first use:
           assign it here, in the master, once. 0 if the type has none to
           give (then it is assigned later, as usual). */
        (void)PyUnstable_Type_AssignVersionTag((PyTypeObject *)op);
    }
    Py_ssize_t size = (k == K_SKIP || k == K_INSTANCE) ? generic_size(op) : size_of(op, k);
    if (size < 0) return -1;
    w->bytes += size;
    if (PyCode_Check(op) || PyDict_Check(op) || PyObject_IS_GC(op)) {
        if (queue_push(&w->queue, op) < 0) return -1;
    }
#if IMMORTAL_OBJECTS
    op->ob_refcnt = w->immortal;
#endif
    w->objects++;
    return 0;
}

static int
heap_expand(walk_state *w, PyObject *op)
{
    if (PyCode_Check(op)) {
        PyCodeObject *code = (PyCodeObject *)op;
        PyObject *parts[] = {
            code->co_consts, code->co_names, code->co_exceptiontable,
            code->co_localsplusnames, code->co_localspluskinds, code->co_filename,
            code->co_name, code->co_qualname, code->co_linetable,
        };
        for (size_t i = 0; i < sizeof(parts) / sizeof(parts[0]); i++) {
            if (heap_visit(parts[i], w) < 0) return -1;
        }
        return 0;
    }
    if (PyDict_Check(op)) {
        Py_ssize_t pos = 0;
        PyObject *key, *value;
        while (PyDict_Next(op, &pos, &key, &value)) {
            if (heap_visit(key, w) < 0 || heap_visit(value, w) < 0) return -1;
        }
    }
    traverseproc traverse = Py_TYPE(op)->tp_traverse;
    if (traverse != NULL && PyObject_IS_GC(op)) {
        if (traverse(op, heap_visit, w) != 0) return -1;
    }
    return 0;
}
#endif

PyDoc_STRVAR(share_heap_doc,
"share_heap(roots, immortal, utf8, /) -> (objects, bytes)\n\n"
"Mark immortal everything reachable from the items of the list roots.\n"
"immortal: the reference count to write (Py_REFCNT(None)). utf8: also cache\n"
"the UTF-8 form of non-ASCII str. Use forkserve.memory.heap.share_heap().");

static PyObject *
share_heap(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 3 || !PyList_CheckExact(args[0])) {
        PyErr_SetString(PyExc_TypeError, "share_heap() takes (list of roots, immortal, utf8)");
        return NULL;
    }
#if IMMORTAL_OBJECTS
    walk_state w = {0};
    w.immortal_mode = 1;
    w.immortal = PyLong_AsSsize_t(args[1]);
    if (w.immortal == -1 && PyErr_Occurred()) return NULL;
    w.utf8 = PyObject_IsTrue(args[2]);
    if (w.utf8 < 0) return NULL;

    PyObject *roots = args[0];
    int status = 0;
    for (Py_ssize_t i = 0; status == 0 && i < PyList_GET_SIZE(roots); i++) {
        PyObject *root = PyList_GET_ITEM(roots, i);
        if (root == roots) continue;
        status = heap_visit(root, &w);
    }
    for (Py_ssize_t i = 0; status == 0 && i < w.queue.len; i++) {
        status = heap_expand(&w, w.queue.items[i].op);
    }
    if (status < 0) undo_marks(&w);
    PyMem_Free(w.queue.items);
    if (status < 0) return NULL;
    return Py_BuildValue("(nn)", w.objects, w.bytes);
#else
    PyErr_SetString(PyExc_RuntimeError, "this Python has no immortal objects (3.12 added them)");
    return NULL;
#endif
}


PyDoc_STRVAR(refcnt_doc,
"refcnt(obj, /) -> int\n\n"
"The raw reference count field of obj (counting this call's references).");

static PyObject *
refcnt(PyObject *module, PyObject *op)
{
    (void)module;
    return PyLong_FromSsize_t(Py_REFCNT(op));
}

PyDoc_STRVAR(is_immortal_doc,
"is_immortal(obj, /) -> bool\n\nWhether the interpreter treats obj as immortal.");

static PyObject *
is_immortal_py(PyObject *module, PyObject *op)
{
    (void)module;
    return PyBool_FromLong(is_immortal(op));
}

#if IMMORTAL_OBJECTS
PyDoc_STRVAR(mark_doc,
"mark(obj, value, /)\n\nWrite value into obj's reference count. Only for share()'s probe.");

static PyObject *
mark(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "mark() takes (obj, value)");
        return NULL;
    }
    Py_ssize_t value = PyLong_AsSsize_t(args[1]);
    if (value == -1 && PyErr_Occurred()) return NULL;
    args[0]->ob_refcnt = value;
    Py_RETURN_NONE;
}
#endif

static PyMethodDef methods[] = {
    {"walk", (PyCFunction)(void (*)(void))walk, METH_FASTCALL, walk_doc},
    {"share_heap", (PyCFunction)(void (*)(void))share_heap, METH_FASTCALL, share_heap_doc},
    {"refcnt", refcnt, METH_O, refcnt_doc},
    {"is_immortal", is_immortal_py, METH_O, is_immortal_doc},
#if IMMORTAL_OBJECTS
    {"mark", (PyCFunction)(void (*)(void))mark, METH_FASTCALL, mark_doc},
#endif
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "forkserve._immortal",
    .m_doc = "C walker behind forkserve.share(); see forkserve/share.py.",
    .m_size = -1,
    .m_methods = methods,
};

static PyObject *
sizeof_method(PyTypeObject *tp)
{
    return PyObject_GetAttrString((PyObject *)tp, "__sizeof__");
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
        if (!dict_sizeof || !set_sizeof || !frozenset_sizeof || !int_sizeof
            || !str_sizeof) {
            Py_CLEAR(dict_sizeof);
            Py_CLEAR(set_sizeof);
            Py_CLEAR(frozenset_sizeof);
            Py_CLEAR(int_sizeof);
            Py_CLEAR(str_sizeof);
            return NULL;
        }
    }
    return PyModule_Create(&module_def);
}
