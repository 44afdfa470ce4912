/* forkserve.memory._whywalk: the object walk of `forkserve memory --why`, in C.
 *
 * walk(roots, pages, page_shift, barrier, progress, every) is the C form of
 * forkserve.memory.why._walk's loop: from each object of the list `roots` in
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
 * - `seen` and the wanted pages are open-addressing hash sets of addresses
 *   (0 marks an empty slot: no object and no page we want lives at 0), grown
 *   to keep them at most 5/8 full. The counts are a third such table keyed
 *   by (page, root index, type); it holds a reference to each type in it.
 *   Pages are stored plus one, so that page 0 is not the empty marker.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <time.h>

/* -- a set of nonzero machine words ----------------------------------------- */

typedef struct {
    uintptr_t *slots;
    size_t mask;   /* capacity - 1, capacity a power of two */
    size_t used;
} WordSet;

static inline size_t
mix(uintptr_t word)
{
    uint64_t x = (uint64_t)word;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return (size_t)x;
}

static int
wordset_init(WordSet *set, size_t capacity)
{
    set->slots = PyMem_RawCalloc(capacity, sizeof(uintptr_t));
    set->mask = capacity - 1;
    set->used = 0;
    return set->slots == NULL ? -1 : 0;
}

/* Adds word; 1 if it was new, 0 if present, -1 out of memory. */
static int wordset_add(WordSet *set, uintptr_t word);

static int
wordset_grow(WordSet *set)
{
    WordSet bigger;
    if (wordset_init(&bigger, (set->mask + 1) * 2) < 0) {
        return -1;
    }
    for (size_t i = 0; i <= set->mask; i++) {
        if (set->slots[i] != 0) {
            wordset_add(&bigger, set->slots[i]);
        }
    }
    PyMem_RawFree(set->slots);
    *set = bigger;
    return 0;
}

static int
wordset_add(WordSet *set, uintptr_t word)
{
    size_t i = mix(word) & set->mask;
    while (set->slots[i] != 0) {
        if (set->slots[i] == word) {
            return 0;
        }
        i = (i + 1) & set->mask;
    }
    set->slots[i] = word;
    set->used++;
    if (set->used * 8 > (set->mask + 1) * 5 && wordset_grow(set) < 0) {
        return -1;
    }
    return 1;
}

static inline int
wordset_has(const WordSet *set, uintptr_t word)
{
    size_t i = mix(word) & set->mask;
    while (set->slots[i] != 0) {
        if (set->slots[i] == word) {
            return 1;
        }
        i = (i + 1) & set->mask;
    }
    return 0;
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

/* Fills a WordSet from an iterable of ints (+ offset, so that 0 stays free). */
static int
fill(WordSet *set, PyObject *iterable, uintptr_t offset)
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
        if (wordset_add(set, word + offset) < 0) {
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
"pages by (page, root index, type). See forkserve/memory/why.py.");

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
    WordSet seen = {0}, wanted = {0};
    Counts counts = {0};
    Stack stack = {PyMem_RawMalloc(1024 * sizeof(PyObject *)), 0, 1024, 0};
    PyObject *result = NULL;
    Py_ssize_t walked = 0;
    if (stack.items == NULL || wordset_init(&seen, 1 << 16) < 0 ||
        wordset_init(&wanted, 1 << 12) < 0 || counts_init(&counts, 1 << 12) < 0) {
        PyErr_NoMemory();
        goto done;
    }
    if (fill(&seen, barrier, 0) < 0 || fill(&wanted, pages, 1) < 0) {
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
            int added = wordset_add(&seen, (uintptr_t)obj);
            if (added == 0) {
                continue;
            }
            if (added < 0) {
                PyErr_NoMemory();
                goto done;
            }
            walked++;
            uintptr_t page = ((uintptr_t)obj >> page_shift) + 1;
            if (wordset_has(&wanted, page) &&
                counts_add(&counts, page, index, Py_TYPE(obj), 1) < 0) {
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
    PyMem_RawFree(seen.slots);
    PyMem_RawFree(wanted.slots);
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
    .m_doc = "The object walk of forkserve memory --why in C; see forkserve/memory/why.py.",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC
PyInit__whywalk(void)
{
    return PyModule_Create(&module_def);
}
