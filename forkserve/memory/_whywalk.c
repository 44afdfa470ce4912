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
 * - `seen` holds the address of each object walked, and `wanted` the page
 *   numbers: both are sets of numbers, _addrset.h's BitSet (bitmaps found
 *   through a small hash table), whose invariants say why no two objects
 *   share a number and why the walk measured 3x faster so than with
 *   open-addressing hash sets of addresses (benchmarks/results/why_walk.md).
 * - The counts are an open-addressing table keyed by (page + 1, root index,
 *   type), 0 marking an empty slot; it holds a reference to each type in it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <time.h>

#include "_addrset.h"
#include "_module.h"

#ifdef Py_GIL_DISABLED
#error "forkserve.memory._whywalk borrows references under the GIL; --why walks in Python here"
#endif

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
            int added = bitset_add_object(&seen, obj);
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

static struct PyModuleDef module_def = MODULE_DEF(
    "forkserve.memory._whywalk",
    "The object walk of forkserve memory --why in C; see forkserve/memory/copied_objects.py.",
    methods);

PyMODINIT_FUNC
PyInit__whywalk(void)
{
    return module_create(&module_def, NULL);
}
