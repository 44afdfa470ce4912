/* forkserve.memory._whywalk: the object walk of `forkserve memory --why`, in C.
 *
 * walk(roots, pages, page_shift, barrier, progress, every) is the C form of
 * forkserve.memory.copied_objects._walk's loop: from each object of the list `roots` in
 * turn, depth first, it visits every object reachable through tp_traverse
 * (the referents gc.get_referents() gives: only GC-tracked objects have any),
 * skipping addresses already seen and the ids in `barrier` (modules and their
 * __dict__s, never walked into). Each object whose address lies on a page
 * number in `pages` (an iterable of ints) is counted under (page, index of
 * its root, its type). It returns ({(page, root index, type): count}, walked).
 * progress(walked), unless None, is called about every `every` seconds.
 *
 * Invariants, and why they hold:
 * - An object belongs to the first root that reaches it, whatever the order
 *   within a root's walk, so this walk and the Python one count the same.
 * - References on the work stack are borrowed. Between taking one off the
 *   stack and traversing it, only C code of this module runs: it allocates
 *   no Python object until the walk ends, so no collection, finalizer or
 *   other thread runs and nothing is freed. The one exception is the
 *   progress callback, which runs Python code: around it every object on
 *   the stack is held by a strong reference, so nothing the stack names can
 *   be freed under us (the caller's `roots` list holds the roots).
 * - `seen` is a set of address / 16 (8 on 32-bit builds): every object is
 *   at least that long (a reference count and a type), so no two start in
 *   the same 16 bytes. It and the wanted pages are sets of numbers kept as
 *   bitmaps of 2**17 consecutive numbers each, found through a small hash
 *   table: a heap's objects sit in few such stretches and neighbours are
 *   often looked up in turn. The walk measured 3x faster so than with
 *   open-addressing hash sets of addresses (benchmarks/results/why_walk.md).
 * - The counts are an open-addressing table keyed by (page + 1, root index,
 *   type), 0 marking an empty slot; it holds a reference to each type in it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <time.h>

#ifdef Py_GIL_DISABLED
#error "forkserve.memory._whywalk borrows references under the GIL; --why walks in Python here"
#endif

static inline size_t
mix(uintptr_t word)
{
    uint64_t x = (uint64_t)word;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return (size_t)x;
}

/* -- a set of numbers: bitmaps of 2**CHUNK_BITS numbers, found by hash --------- */

/* seen holds address >> ADDRESS_SHIFT: see the invariants above. */
#define ADDRESS_SHIFT (sizeof(PyObject) >= 16 ? 4 : 3)
#define CHUNK_BITS 17   /* 16 KiB of bits per chunk */
#define CHUNK_WORDS (((size_t)1 << CHUNK_BITS) / 64)

typedef struct {
    uintptr_t key;   /* chunk number + 1; 0: empty slot */
    uint64_t *bits;
} Chunk;

typedef struct {
    Chunk *slots;
    size_t mask;   /* capacity - 1, capacity a power of two */
    size_t used;
    uintptr_t last_key;   /* the chunk found last: the next number is often in it */
    uint64_t *last_bits;
} BitSet;

static int
bitset_init(BitSet *set, size_t capacity)
{
    *set = (BitSet){PyMem_RawCalloc(capacity, sizeof(Chunk)), capacity - 1, 0, 0, NULL};
    return set->slots == NULL ? -1 : 0;
}

static void
bitset_free(BitSet *set)
{
    for (size_t i = 0; set->slots != NULL && i <= set->mask; i++) {
        PyMem_RawFree(set->slots[i].bits);
    }
    PyMem_RawFree(set->slots);
}

static inline size_t
chunk_slot(const BitSet *set, uintptr_t key)
{
    size_t i = mix(key) & set->mask;
    while (set->slots[i].key != 0 && set->slots[i].key != key) {
        i = (i + 1) & set->mask;
    }
    return i;
}

/* The bits of the chunk holding number; NULL if absent (or, when create,
   out of memory). */
static uint64_t *
bitset_chunk(BitSet *set, uintptr_t number, int create)
{
    uintptr_t key = (number >> CHUNK_BITS) + 1;
    if (key == set->last_key) {
        return set->last_bits;
    }
    Chunk *slot = &set->slots[chunk_slot(set, key)];
    if (slot->key == 0) {
        if (!create) {
            return NULL;
        }
        uint64_t *bits = PyMem_RawCalloc(CHUNK_WORDS, sizeof(uint64_t));
        if (bits == NULL) {
            return NULL;
        }
        *slot = (Chunk){key, bits};
        if (++set->used * 2 > set->mask + 1) {
            BitSet bigger;
            if (bitset_init(&bigger, (set->mask + 1) * 2) < 0) {
                set->used--;  /* undo, so bitset_free() frees each chunk once */
                *slot = (Chunk){0, NULL};
                PyMem_RawFree(bits);
                return NULL;
            }
            for (size_t i = 0; i <= set->mask; i++) {
                if (set->slots[i].key != 0) {
                    bigger.slots[chunk_slot(&bigger, set->slots[i].key)] = set->slots[i];
                }
            }
            bigger.used = set->used;
            PyMem_RawFree(set->slots);
            *set = bigger;
        }
        set->last_key = key;
        set->last_bits = bits;
        return bits;
    }
    set->last_key = key;
    set->last_bits = slot->bits;
    return slot->bits;
}

/* Adds number; 1 if it was new, 0 if present, -1 out of memory. */
static inline int
bitset_add(BitSet *set, uintptr_t number)
{
    uint64_t *bits = bitset_chunk(set, number, 1);
    if (bits == NULL) {
        return -1;
    }
    size_t bit = number & (((size_t)1 << CHUNK_BITS) - 1);
    uint64_t mask = (uint64_t)1 << (bit & 63);
    if (bits[bit >> 6] & mask) {
        return 0;
    }
    bits[bit >> 6] |= mask;
    return 1;
}

static inline int
bitset_has(BitSet *set, uintptr_t number)
{
    uint64_t *bits = bitset_chunk(set, number, 0);
    size_t bit = number & (((size_t)1 << CHUNK_BITS) - 1);
    return bits != NULL && (bits[bit >> 6] >> (bit & 63)) & 1;
}

/* -- counts by (page, root index, type) ---------------------------------------- */

typedef struct {
    uintptr_t page;   /* 0: empty slot */
    Py_ssize_t root;
    PyTypeObject *type;
    Py_ssize_t count;
} Count;

typedef struct {
    Count *slots;
    size_t mask;
    size_t used;
} Counts;

static int
counts_init(Counts *counts, size_t capacity)
{
    counts->slots = PyMem_RawCalloc(capacity, sizeof(Count));
    counts->mask = capacity - 1;
    counts->used = 0;
    return counts->slots == NULL ? -1 : 0;
}

static inline size_t
count_slot(const Counts *counts, uintptr_t page, Py_ssize_t root, PyTypeObject *type)
{
    size_t i = mix(page ^ ((uintptr_t)root << 40) ^ (uintptr_t)type * 31) & counts->mask;
    while (counts->slots[i].page != 0 &&
           !(counts->slots[i].page == page && counts->slots[i].root == root &&
             counts->slots[i].type == type)) {
        i = (i + 1) & counts->mask;
    }
    return i;
}

/* Adds n under the key; -1 out of memory. */
static int
counts_add(Counts *counts, uintptr_t page, Py_ssize_t root, PyTypeObject *type, Py_ssize_t n)
{
    Count *slot = &counts->slots[count_slot(counts, page, root, type)];
    if (slot->page != 0) {
        slot->count += n;
        return 0;
    }
    Py_INCREF(type);  /* a type outlives the table, even if its objects do not */
    *slot = (Count){page, root, type, n};
    counts->used++;
    if (counts->used * 8 > (counts->mask + 1) * 5) {
        Counts bigger;
        if (counts_init(&bigger, (counts->mask + 1) * 2) < 0) {
            return -1;
        }
        for (size_t i = 0; i <= counts->mask; i++) {
            Count *old = &counts->slots[i];
            if (old->page != 0) {
                bigger.slots[count_slot(&bigger, old->page, old->root, old->type)] = *old;
                bigger.used++;
            }
        }
        PyMem_RawFree(counts->slots);
        *counts = bigger;
    }
    return 0;
}

/* -- the work stack ------------------------------------------------------------ */

typedef struct {
    PyObject **items;
    size_t size;
    size_t capacity;
    int failed;   /* set when a push ran out of memory */
} Stack;

static int
visit(PyObject *referent, void *arg)
{
    Stack *stack = (Stack *)arg;
    if (stack->size == stack->capacity) {
        size_t capacity = stack->capacity * 2;
        PyObject **items = PyMem_RawRealloc(stack->items, capacity * sizeof(PyObject *));
        if (items == NULL) {
            stack->failed = 1;
            return -1;
        }
        stack->items = items;
        stack->capacity = capacity;
    }
    stack->items[stack->size++] = referent;
    return 0;
}

static double
now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Calls progress(walked) with every object on the stack held. */
static int
report(PyObject *progress, Stack *stack, Py_ssize_t walked)
{
    for (size_t i = 0; i < stack->size; i++) {
        Py_INCREF(stack->items[i]);
    }
    PyObject *result = PyObject_CallFunction(progress, "n", walked);
    for (size_t i = 0; i < stack->size; i++) {
        Py_DECREF(stack->items[i]);
    }
    Py_XDECREF(result);
    return result == NULL ? -1 : 0;
}

/* {(page, root index, type): count} from the table. */
static PyObject *
counts_dict(const Counts *counts)
{
    PyObject *result = PyDict_New();
    if (result == NULL) {
        return NULL;
    }
    for (size_t i = 0; i <= counts->mask; i++) {
        const Count *c = &counts->slots[i];
        if (c->page == 0) {
            continue;
        }
        PyObject *key = Py_BuildValue("(knO)", (unsigned long)(c->page - 1), c->root, (PyObject *)c->type);
        PyObject *value = PyLong_FromSsize_t(c->count);
        if (key == NULL || value == NULL || PyDict_SetItem(result, key, value) < 0) {
            Py_XDECREF(key);
            Py_XDECREF(value);
            Py_DECREF(result);
            return NULL;
        }
        Py_DECREF(key);
        Py_DECREF(value);
    }
    return result;
}

/* Adds every int of iterable, shifted right by shift, to set. */
static int
fill(BitSet *set, PyObject *iterable, int shift)
{
    PyObject *iterator = PyObject_GetIter(iterable);
    if (iterator == NULL) {
        return -1;
    }
    PyObject *item;
    while ((item = PyIter_Next(iterator)) != NULL) {
        uintptr_t word = (uintptr_t)PyLong_AsUnsignedLongLong(item);
        Py_DECREF(item);
        if (PyErr_Occurred()) {
            Py_DECREF(iterator);
            return -1;
        }
        if (bitset_add(set, word >> shift) < 0) {
            Py_DECREF(iterator);
            PyErr_NoMemory();
            return -1;
        }
    }
    Py_DECREF(iterator);
    return PyErr_Occurred() ? -1 : 0;
}

PyDoc_STRVAR(walk_doc,
"walk(roots, pages, page_shift, barrier, progress, every) -> (counts, walked)\n\n"
"Walk from each of the list roots in turn; count the objects on the given\n"
"pages by (page, root index, type). See forkserve/memory/copied_objects.py.");

static PyObject *
walk(PyObject *module, PyObject *args)
{
    PyObject *roots, *pages, *barrier, *progress;
    int page_shift;
    double every;
    if (!PyArg_ParseTuple(args, "O!OiOOd:walk", &PyList_Type, &roots, &pages, &page_shift,
                          &barrier, &progress, &every)) {
        return NULL;
    }
    if (page_shift < 1 || page_shift > 30) {
        PyErr_Format(PyExc_ValueError, "page_shift %d is not the shift of a page size", page_shift);
        return NULL;
    }
    BitSet seen = {0}, wanted = {0};
    Counts counts = {0};
    Stack stack = {PyMem_RawMalloc(1024 * sizeof(PyObject *)), 0, 1024, 0};
    PyObject *result = NULL;
    Py_ssize_t walked = 0;
    if (stack.items == NULL || bitset_init(&seen, 1 << 10) < 0 ||
        bitset_init(&wanted, 1 << 6) < 0 || counts_init(&counts, 1 << 12) < 0) {
        PyErr_NoMemory();
        goto done;
    }
    if (fill(&seen, barrier, ADDRESS_SHIFT) < 0 || fill(&wanted, pages, 0) < 0) {
        goto done;
    }
    int reporting = progress != Py_None;
    double report_at = now() + every;
    Py_ssize_t clock_at = 1 << 13;
    for (Py_ssize_t index = 0; index < PyList_GET_SIZE(roots); index++) {
        stack.size = 0;
        stack.items[stack.size++] = PyList_GET_ITEM(roots, index);
        while (stack.size > 0) {
            PyObject *obj = stack.items[--stack.size];
            int added = bitset_add(&seen, (uintptr_t)obj >> ADDRESS_SHIFT);
            if (added == 0) {
                continue;
            }
            if (added < 0) {
                PyErr_NoMemory();
                goto done;
            }
            walked++;
            uintptr_t page = (uintptr_t)obj >> page_shift;
            if (bitset_has(&wanted, page) &&
                counts_add(&counts, page + 1, index, Py_TYPE(obj), 1) < 0) {
                PyErr_NoMemory();
                goto done;
            }
            traverseproc traverse = Py_TYPE(obj)->tp_traverse;
            if (traverse != NULL && PyObject_IS_GC(obj)) {
                traverse(obj, visit, &stack);
                if (stack.failed) {
                    PyErr_NoMemory();
                    goto done;
                }
            }
            if (walked >= clock_at) {
                clock_at += 1 << 13;
                if (reporting && now() >= report_at) {
                    if (report(progress, &stack, walked) < 0) {
                        goto done;
                    }
                    report_at = now() + every;
                }
            }
        }
    }
    PyObject *found = counts_dict(&counts);
    if (found != NULL) {
        result = Py_BuildValue("(Nn)", found, walked);
    }
done:
    for (size_t i = 0; counts.slots != NULL && i <= counts.mask; i++) {
        if (counts.slots[i].page != 0) {
            Py_DECREF(counts.slots[i].type);
        }
    }
    bitset_free(&seen);
    bitset_free(&wanted);
    PyMem_RawFree(counts.slots);
    PyMem_RawFree(stack.items);
    return result;
}

static PyMethodDef methods[] = {
    {"walk", walk, METH_VARARGS, walk_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "forkserve.memory._whywalk",
    .m_doc = "The object walk of forkserve memory --why in C; see forkserve/memory/copied_objects.py.",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC
PyInit__whywalk(void)
{
    return PyModule_Create(&module_def);
}
