/*
 * forkserve.memory._free_space: take the allocators' free space in the
 * master before a worker's fork, for good.
 *
 * After fork() a worker allocates from the same allocator state as the
 * master. Free blocks inside pymalloc pools that also hold the master's live
 * objects, and free chunks in glibc's main heap between them, would be the
 * first places the worker's allocations land: each such write copies a page
 * of the master's data, many times the memory the allocation needed. hold()
 * allocates that free space in the master just before the fork; the worker
 * starts with none, so its allocations go to fresh pools and to the top of
 * the heap.
 *
 * Checked against CPython 3.11, 3.12 and 3.13 (pymalloc, glibc 2.36).
 *
 * Invariants:
 * - What hold() allocates is never freed, in the master or in a worker.
 *   Freeing it in the master after the fork would write allocator headers
 *   into pages the workers share, copying them in the master and leaving the
 *   workers' originals counted as theirs alone. So it is not recorded: hold()
 *   only counts it. glibc's free pages go back to the system first
 *   (malloc_trim), and a big chunk's interior pages are not touched, so the
 *   master's resident memory does not grow by it.
 * - hold(limit) takes at most `limit` bytes in all.
 * - hold() assumes what allocator() and glibc_malloc() check, and its caller
 *   (forkserve.memory.free_space) checks them first: the object allocator is
 *   pymalloc without hooks (debug hooks pad each block, so a request of one
 *   size class lands in another and the free blocks counted are not the ones
 *   taken), and the malloc() linked at run time is glibc's (an LD_PRELOADed
 *   jemalloc or tcmalloc keeps no glibc heap to take holes from).
 * - pymalloc: the free blocks per size class come from the table
 *   _PyObject_DebugMallocStats prints (sys._debugmallocstats()), private
 *   text. Before anything is taken the table must add up: every size class
 *   where its size says, and the blocks in use and available, times their
 *   sizes, equal to the totals it prints; otherwise StatsError, and nothing
 *   is taken. After the take the table is read again: every block taken must
 *   have come from the free blocks counted (none left over, no new pool).
 * - glibc heap: a chunk malloc() returns from below the top chunk is free
 *   space between live data; the first one from the top chunk (or from
 *   mmap()) ends the size being tried, and is freed at once (it merges back
 *   into the top).
 * - Runs with the GIL, in the master. Nothing between reading the table and
 *   taking its blocks allocates from pymalloc (the table's text is malloc()ed).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <dlfcn.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include "_module.h"

/* Exported by CPython 3.11-3.13, declared only in an internal header. It
 * prints the table and returns 1 when pymalloc is the object allocator (with
 * or without debug hooks over it), and prints nothing and returns 0 otherwise. */
extern int _PyObject_DebugMallocStats(FILE *out);

static PyObject *StatsError;

/* pymalloc's size classes: 32 on 64-bit CPython 3.11-3.13, 64 at most. */
#define MAX_CLASSES 64

typedef struct {
    long long size, pools, used, free;
} Row;

typedef struct {
    int classes; /* size classes, from the header */
    Row rows[MAX_CLASSES]; /* by class; size 0 where the table has no row */
    long long allocated_bytes, available_bytes; /* the totals it prints, -1 if absent */
} Table;

/* The number after '=' in `line`, its thousands separators skipped; -1 if none. */
static long long
total_after_equals(const char *line)
{
    const char *at = strchr(line, '=');
    if (at == NULL) {
        return -1;
    }
    long long value = -1;
    for (at++; *at; at++) {
        if (*at >= '0' && *at <= '9') {
            value = (value < 0 ? 0 : value * 10) + (*at - '0');
        }
        else if (*at != ',' && *at != ' ') {
            break;
        }
    }
    return value;
}

/* Print pymalloc's table and parse it into `table`. 0, or -1 with StatsError
 * set saying what did not add up. */
static int
read_table(Table *table)
{
    char *text = NULL;
    size_t length = 0;
    FILE *out = open_memstream(&text, &length);
    if (out == NULL) {
        PyErr_SetString(StatsError, "open_memstream() failed");
        return -1;
    }
    int printed = _PyObject_DebugMallocStats(out);
    fclose(out);
    memset(table, 0, sizeof(*table));
    table->allocated_bytes = table->available_bytes = -1;
    int threshold = 0, rows = 0;
    const char *problem = NULL;
    for (char *line = printed ? text : NULL; line && *line && problem == NULL;) {
        char *next = strchr(line, '\n');
        if (next) {
            *next++ = '\0';
        }
        int size_class, size, pools, used, free_blocks;
        if (sscanf(line, "Small block threshold = %d, in %d size classes.", &threshold,
                   &table->classes) == 2) {
            if (table->classes <= 0 || table->classes > MAX_CLASSES || threshold <= 0
                    || threshold % table->classes) {
                problem = "the header names size classes this code does not know";
            }
        }
        else if (sscanf(line, " %d %d %d %d %d", &size_class, &size, &pools, &used,
                        &free_blocks) == 5) {
            if (table->classes == 0 || size_class < 0 || size_class >= table->classes
                    || size != (size_class + 1) * (threshold / table->classes)
                    || table->rows[size_class].size != 0 || pools <= 0 || used < 0
                    || free_blocks < 0) {
                problem = "a row of the size-class table is not where its size says";
            }
            else {
                table->rows[size_class] = (Row){size, pools, used, free_blocks};
                rows++;
            }
        }
        else if (strncmp(line, "# bytes in allocated blocks", 27) == 0) {
            table->allocated_bytes = total_after_equals(line);
        }
        else if (strncmp(line, "# bytes in available blocks", 27) == 0) {
            table->available_bytes = total_after_equals(line);
        }
        line = next;
    }
    free(text);
    if (problem == NULL && !printed) {
        problem = "pymalloc printed no table (it is not the object allocator)";
    }
    if (problem == NULL && (rows == 0 || table->allocated_bytes < 0
                            || table->available_bytes < 0)) {
        problem = "the table has no size-class rows or no totals";
    }
    if (problem == NULL) {
        long long allocated = 0, available = 0;
        for (int i = 0; i < table->classes; i++) {
            allocated += table->rows[i].size * table->rows[i].used;
            available += table->rows[i].size * table->rows[i].free;
        }
        if (allocated != table->allocated_bytes || available != table->available_bytes) {
            PyErr_Format(StatsError, "the size classes add up to %lld bytes in use and %lld "
                         "available, the table's totals say %lld and %lld", allocated,
                         available, table->allocated_bytes, table->available_bytes);
            return -1;
        }
    }
    if (problem != NULL) {
        PyErr_SetString(StatsError, problem);
        return -1;
    }
    return 0;
}

/* Free pymalloc blocks, class by class, up to `limit` bytes: the bytes taken,
 * or -1 with StatsError set (nothing taken). *missed and *new_pools say how far
 * the take was from the table: blocks counted free but still free after it,
 * and pools it made (blocks taken from fresh memory, not from holes); both -1
 * when the table read after the take did not add up. */
static long long
hold_blocks(long long limit, long long *missed, long long *new_pools)
{
    Table before, after;
    long long taken[MAX_CLASSES] = {0};
    long long bytes = 0;
    if (read_table(&before) < 0) {
        return -1;
    }
    for (int i = 0; i < before.classes && bytes < limit; i++) {
        Row *row = &before.rows[i];
        long long count = row->size ? (limit - bytes) / row->size : 0;
        count = count < row->free ? count : row->free;
        for (; taken[i] < count; taken[i]++) {
            if (PyObject_Malloc((size_t)row->size) == NULL) {
                PyErr_Clear();
                break;
            }
        }
        bytes += taken[i] * row->size;
    }
    if (read_table(&after) < 0) {  /* taken, but cannot be checked: say so with -1 */
        PyErr_Clear();
        *missed = *new_pools = -1;
        return bytes;
    }
    *missed = *new_pools = 0;
    for (int i = 0; i < before.classes && i < after.classes; i++) {
        long long left = after.rows[i].free - (before.rows[i].free - taken[i]);
        long long made = after.rows[i].pools - before.rows[i].pools;
        *missed += left > 0 ? left : 0;
        *new_pools += made > 0 ? made : 0;
    }
    return bytes;
}

/* Every free chunk below glibc's top chunk, up to `limit` bytes, biggest sizes
 * first so that a big free chunk is taken whole before small requests split it. */
static long long
hold_chunks(long long limit)
{
    long long bytes = 0;
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33))
    /* The whole pages inside free chunks go back to the system first, so that
     * holding the chunks keeps only their headers' pages resident. */
    malloc_trim(0);
    struct mallinfo2 info = mallinfo2();
    char *top = (char *)sbrk(0) - info.keepcost;
    size_t size = (size_t)1 << 17;
    while (size >= 16) {
        while (bytes + (long long)size <= limit) {
            char *chunk = malloc(size);
            if (chunk == NULL) {
                return bytes;
            }
            if (chunk >= top) {
                free(chunk);
                break;
            }
            bytes += size;
        }
        /* Every 16 bytes up to 1 KiB (glibc's exact-size bins), then steps of 1/8. */
        if (size > 1024) {
            size = (size - size / 8) & ~(size_t)15;
            size = size < 1024 ? 1024 : size;
        }
        else {
            size -= 16;
        }
    }
#endif
    return bytes;
}

static PyObject *
hold(PyObject *module, PyObject *args)
{
    long long limit;
    if (!PyArg_ParseTuple(args, "L:hold", &limit)) {
        return NULL;
    }
    long long missed = 0, new_pools = 0;
    /* first: the tables' text is malloc()ed, then freed, and its chunks are taken after */
    long long pool_bytes = hold_blocks(limit, &missed, &new_pools);
    if (pool_bytes < 0) {
        return NULL;
    }
    long long heap_bytes = hold_chunks(limit - pool_bytes);
    return Py_BuildValue("LLLL", pool_bytes, heap_bytes, missed, new_pools);
}

static PyObject *
allocator(PyObject *module, PyObject *unused)
{
    PyMemAllocatorEx object, raw;
    PyMem_GetAllocator(PYMEM_DOMAIN_OBJ, &object);
    PyMem_GetAllocator(PYMEM_DOMAIN_RAW, &raw);
    char *text = NULL;
    size_t length = 0;
    FILE *out = open_memstream(&text, &length);
    int pymalloc = 0;
    if (out != NULL) {
        pymalloc = _PyObject_DebugMallocStats(out);
        fclose(out);
        free(text);
    }
    const char *name;
    if (pymalloc) {
        /* pymalloc's own functions carry no context; the debug hooks over it do */
        name = object.ctx == NULL ? "pymalloc" : "pymalloc_debug";
    }
    else if (object.malloc == raw.malloc && object.ctx == NULL && raw.ctx == NULL) {
        name = "malloc";
    }
    else {
        name = "other";
    }
    return PyUnicode_FromString(name);
}

#ifdef __GLIBC__
/* Whether the symbol at address is defined where it lies. A non-PIE
   executable that takes malloc's address has a "canonical PLT entry" for it
   (Debian's python3.14 has one): dlsym(RTLD_DEFAULT) returns that stub, whose
   symbol is undefined, while calls still go to the first real definition. */
static int
defined_at(void *address)
{
    Dl_info info;
    const ElfW(Sym) *symbol = NULL;
    if (address == NULL
        || !dladdr1(address, &info, (void **)&symbol, RTLD_DL_SYMENT) || symbol == NULL) {
        return 0;
    }
    return symbol->st_shndx != SHN_UNDEF;
}

/* dl_iterate_phdr's callback: stop (1) at a loaded object other than glibc's
   that defines malloc itself (an LD_PRELOADed jemalloc or tcmalloc). */
static int
defines_malloc(struct dl_phdr_info *object, size_t size, void *glibcs)
{
    (void)size;
    if (object->dlpi_name == NULL || object->dlpi_name[0] == '\0') return 0;  /* the program */
    void *handle = dlopen(object->dlpi_name, RTLD_LAZY | RTLD_NOLOAD);
    if (handle == NULL) return 0;
    void *found = dlsym(handle, "malloc");  /* the object's, or a dependency's */
    int other = found != NULL && found != glibcs && defined_at(found);
    dlclose(handle);
    return other;
}
#endif

static PyObject *
glibc_malloc(PyObject *module, PyObject *unused)
{
    int same = 0;
#ifdef __GLIBC__
    void *libc = dlopen("libc.so.6", RTLD_LAZY | RTLD_NOLOAD);
    if (libc != NULL) {
        void *glibcs = dlsym(libc, "malloc");
        void *linked = dlsym(RTLD_DEFAULT, "malloc");
        if (glibcs != NULL && linked == glibcs) {
            same = 1;
        }
        else if (glibcs != NULL && !defined_at(linked)) {
            /* The program's canonical PLT stub: glibc's, unless another loaded
               object defines malloc. */
            same = !dl_iterate_phdr(defines_malloc, glibcs);
        }
        dlclose(libc);
    }
#endif
    return PyBool_FromLong(same);
}

PyDoc_STRVAR(hold_doc,
"hold(limit) -> (pool_bytes, heap_bytes, missed_blocks, new_pools)\n\n"
"Allocate, for good and up to limit bytes in all, the free pymalloc blocks in\n"
"pools in use and the free glibc chunks below the top of the heap. missed_blocks\n"
"and new_pools say how far the pymalloc take was from the table it read (both 0\n"
"when it took exactly the free blocks, -1 when it could not be checked).\n"
"Raises StatsError, taking nothing, when pymalloc's table does not add up.\n"
"Check allocator() and glibc_malloc() first; use forkserve.memory.free_space.");

PyDoc_STRVAR(allocator_doc,
"allocator() -> str\n\n"
"The object allocator in effect now: 'pymalloc', 'pymalloc_debug' (pymalloc\n"
"under the debug hooks), 'malloc' (PYTHONMALLOC=malloc), or 'other' (malloc\n"
"under the debug hooks, tracemalloc's hooks, another allocator).");

PyDoc_STRVAR(glibc_malloc_doc,
"glibc_malloc() -> bool\n\n"
"Whether the malloc() this process calls, as linked at run time, is glibc's\n"
"own (False under an LD_PRELOADed jemalloc or tcmalloc, or without glibc).");

static PyMethodDef methods[] = {
    {"hold", hold, METH_VARARGS, hold_doc},
    {"allocator", allocator, METH_NOARGS, allocator_doc},
    {"glibc_malloc", glibc_malloc, METH_NOARGS, glibc_malloc_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = MODULE_DEF(
    "forkserve.memory._free_space",
    "Take the allocators' free space in the master before a worker's fork.",
    methods);

static int
add_stats_error(PyObject *module)
{
    StatsError = PyErr_NewExceptionWithDoc(
        "forkserve.memory._free_space.StatsError",
        "pymalloc's statistics table did not add up: nothing was taken.",
        PyExc_RuntimeError, NULL);
    if (StatsError == NULL) {
        return -1;
    }
    return PyModule_AddObjectRef(module, "StatsError", StatsError);
}

PyMODINIT_FUNC
PyInit__free_space(void)
{
    return module_create(&module_def, add_stats_error);
}
