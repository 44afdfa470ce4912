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
 * - What hold() allocates is never freed, in the master or in a worker.
 *   Freeing it in the master after the fork would write allocator headers
 *   into pages the workers share, copying them in the master and leaving
 *   the workers' originals counted as theirs alone. So it is not recorded
 *   anywhere: hold() only counts it. Most of it is already resident (free
 *   space the master once used), and a big chunk's interior pages are not
 *   touched, so the master's resident memory barely changes.
 * - Runs with the GIL, in the master, immediately before fork().
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
#include <unistd.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

/* Exported by CPython 3.11-3.13, declared only in an internal header. */
extern int _PyObject_DebugMallocStats(FILE *out);

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
                if (PyObject_Malloc((size_t)size) == NULL) {
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
    struct mallinfo2 info = mallinfo2();
    char *top = (char *)sbrk(0) - info.keepcost;
    size_t size = (size_t)1 << 17;
    while (size >= 16) {
        for (;;) {
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
hold(PyObject *module, PyObject *unused)
{
    size_t pool_bytes = hold_blocks(); /* first: its report's buffer is malloc()ed, then freed */
    size_t heap_bytes = hold_chunks();
    return Py_BuildValue("nn", (Py_ssize_t)pool_bytes, (Py_ssize_t)heap_bytes);
}

PyDoc_STRVAR(hold_doc,
"hold() -> (pool_bytes, heap_bytes)\n\n"
"Allocate, for good, every free pymalloc block in pools in use and every\n"
"free glibc chunk below the top of the heap. Use\n"
"forkserve.memory.free_space.before_fork().");

static PyMethodDef methods[] = {
    {"hold", hold, METH_NOARGS, hold_doc},
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
