/*
 * forkserve.memory._free_space: take the allocators' free space in the
 * master before a worker's fork, for good.
 *
 * After fork() a worker allocates from the same allocator state as the
 * master. Free blocks inside pymalloc pools that also hold the master's live
 * objects, and free chunks in glibc's main heap between them, would be the
 * first places the worker's allocations land: each such write copies a page
 * of the master's data, many times the memory the allocation needed. hold()
 * allocates all of that free space in the master just before the fork; the
 * worker starts with none, so its allocations go to fresh pools and to the
 * top of the heap.
 *
 * Invariants:
 * - What hold() allocates before a fork is never freed, in the master or in
 *   a worker. Freeing it in the master after the fork would write allocator
 *   headers into pages the workers share, copying them in the master and
 *   leaving the workers' originals counted as theirs alone. So it is not
 *   recorded: hold() only counts it. glibc's free pages go back to the
 *   system first (malloc_trim), and a big chunk's interior pages are not
 *   touched, so the master's resident memory does not grow by it.
 * - hold(record=True) is for the master before any fork (placing objects on
 *   fresh pages, forkserve.memory.code_layout): it records what it took, in
 *   mmap()ed memory so that keeping the record takes none of the space being
 *   held, and release() frees it all again.
 * - Runs with the GIL, in the master.
 * - pymalloc: the count of free blocks per size class comes from
 *   _PyObject_DebugMallocStats (the table sys._debugmallocstats() prints);
 *   when pymalloc is not the allocator (PYTHONMALLOC=malloc) it prints
 *   nothing and no block is held.
 * - glibc heap: a chunk malloc() returns from below the top chunk is free
 *   space between live data; the first one from the top chunk (or from
 *   mmap()) ends the size being tried, and is freed at once (it merges back
 *   into the top). With another malloc than glibc's nothing is held.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

/* Exported by CPython 3.11-3.13, declared only in an internal header. */
extern int _PyObject_DebugMallocStats(FILE *out);

/* What hold(record=True) took, for release(): in mmap()ed memory, so that keeping the
 * record takes none of the space being held. */
typedef struct {
    void **items;
    size_t count;
    size_t capacity;
} Record;

static Record record_blocks; /* pymalloc blocks: PyObject_Free */
static Record record_chunks; /* glibc chunks: free */
static int recording;

/* Keep `pointer` in `record` if recording; 0, or -1 if it could not be kept
 * (the caller frees it then, and stops taking). */
static int
keep(Record *record, void *pointer)
{
    if (!recording) {
        return 0;
    }
    if (record->count == record->capacity) {
        size_t capacity = record->capacity ? record->capacity * 2 : 65536;
        void **items = mmap(NULL, capacity * sizeof(void *), PROT_READ | PROT_WRITE,
                            MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (items == MAP_FAILED) {
            return -1;
        }
        if (record->items) {
            memcpy(items, record->items, record->count * sizeof(void *));
            munmap(record->items, record->capacity * sizeof(void *));
        }
        record->items = items;
        record->capacity = capacity;
    }
    record->items[record->count++] = pointer;
    return 0;
}

static size_t
give_back(Record *record, void (*release_one)(void *))
{
    size_t count = record->count;
    for (size_t i = 0; i < count; i++) {
        release_one(record->items[i]);
    }
    if (record->items) {
        munmap(record->items, record->capacity * sizeof(void *));
    }
    record->items = NULL;
    record->count = record->capacity = 0;
    return count;
}

/* Every free block of every pymalloc pool in use, one size class at a time. */
static size_t
hold_blocks(void)
{
    size_t bytes = 0;
    char *text = NULL;
    size_t length = 0;
    FILE *out = open_memstream(&text, &length);
    if (out == NULL) {
        return 0;
    }
    int printed = _PyObject_DebugMallocStats(out);
    fclose(out);
    /* The table: "class size pools-in-use blocks-in-use free-blocks". */
    for (char *line = printed ? text : NULL; line && *line;) {
        char *next = strchr(line, '\n');
        if (next) {
            *next++ = '\0';
        }
        int size_class, size, pools, used, free_blocks;
        if (sscanf(line, " %d %d %d %d %d", &size_class, &size, &pools, &used,
                   &free_blocks) == 5
                && size > 0 && size <= 512 && free_blocks > 0) {
            for (int i = 0; i < free_blocks; i++) {
                void *block = PyObject_Malloc((size_t)size);
                if (block == NULL) {
                    break;
                }
                if (keep(&record_blocks, block) < 0) {
                    PyObject_Free(block);
                    break;
                }
                bytes += (size_t)size;
            }
        }
        line = next;
    }
    free(text);
    return bytes;
}

/* Every free chunk below glibc's top chunk, biggest sizes first so that a
 * big free chunk is taken whole before small requests split it. */
static size_t
hold_chunks(void)
{
    size_t bytes = 0;
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33))
    /* The whole pages inside free chunks go back to the system first, so that
     * holding the chunks keeps only their headers' pages resident. */
    malloc_trim(0);
    struct mallinfo2 info = mallinfo2();
    char *top = (char *)sbrk(0) - info.keepcost;
    size_t size = (size_t)1 << 17;
    while (size >= 16) {
        for (;;) {
            char *chunk = malloc(size);
            if (chunk == NULL) {
                return bytes;
            }
            if (chunk >= top || keep(&record_chunks, chunk) < 0) {
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
    int record = 0;
    if (!PyArg_ParseTuple(args, "|p:hold", &record)) {
        return NULL;
    }
    if (recording) {
        PyErr_SetString(PyExc_RuntimeError, "hold() while a recorded hold is not released");
        return NULL;
    }
    recording = record;
    size_t pool_bytes = hold_blocks(); /* first: its report's buffer is malloc()ed, then freed */
    size_t heap_bytes = hold_chunks();
    return Py_BuildValue("nn", (Py_ssize_t)pool_bytes, (Py_ssize_t)heap_bytes);
}

static void
free_block(void *block)
{
    PyObject_Free(block);
}

static PyObject *
release(PyObject *module, PyObject *unused)
{
    size_t count = give_back(&record_chunks, free) + give_back(&record_blocks, free_block);
    recording = 0;
    return PyLong_FromSize_t(count);
}

PyDoc_STRVAR(hold_doc,
"hold(record=False) -> (pool_bytes, heap_bytes)\n\n"
"Allocate every free pymalloc block in pools in use and every free glibc\n"
"chunk below the top of the heap: for good, or with record=True until\n"
"release(). Use forkserve.memory.free_space.");

PyDoc_STRVAR(release_doc,
"release() -> count\n\nFree what hold(record=True) took: how many blocks and chunks.");

static PyMethodDef methods[] = {
    {"hold", hold, METH_VARARGS, hold_doc},
    {"release", release, METH_NOARGS, release_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "forkserve.memory._free_space",
    "Take the allocators' free space in the master across a worker's fork.", -1, methods,
};

PyMODINIT_FUNC
PyInit__free_space(void)
{
    return PyModule_Create(&module);
}
