/* forkserve/memory/_addrset.h: the set of numbers (object addresses, page
 * numbers) that forkserve's C walks keep: _whywalk's seen objects and wanted
 * pages, and _immortal's hash_only() visited mark. Included by each; every
 * function is static, so each extension has its own copy.
 *
 * Invariants, and why they hold:
 * - A set holds numbers, not pointers: an object is added as
 *   address >> ADDRESS_SHIFT (16 bytes on 64-bit builds, 8 on 32-bit).
 *   Every object is at least that long (a reference count and a type), so
 *   no two start in the same 16 (8) bytes and none share a number.
 * - The numbers are kept as bitmaps of 2**CHUNK_BITS consecutive numbers
 *   each (16 KiB of bits, 2 MiB of heap per chunk of addresses), found
 *   through a small open-addressing hash table keyed by chunk number + 1
 *   (0 marks an empty slot), and the chunk found last is looked at first.
 *   A heap's objects sit in few such stretches and neighbours are often
 *   looked up in turn, so this stays in the cache where a hash set of
 *   pointers misses it on every object: the --why walk measured 3x faster
 *   so than with open-addressing hash sets of addresses
 *   (benchmarks/results/why_walk.md). It costs 8 KiB per MiB of heap.
 * - The table is at most half full: it doubles when a chunk would pass that.
 * - Only the raw allocator is used (PyMem_Raw*): the set allocates no Python
 *   object, so no collection, finaliser or other thread runs while a walk
 *   fills it. Its functions set no Python exception: -1 or NULL means out of
 *   memory, and the caller raises MemoryError.
 * - A set is usable after bitset_init(); bitset_free() frees one that was
 *   initialised, and one that is all zeros ({0}: never initialised).
 */
#ifndef FORKSERVE_ADDRSET_H
#define FORKSERVE_ADDRSET_H

#include <Python.h>
#include <stdint.h>

static inline size_t
mix(uintptr_t word)
{
    uint64_t x = (uint64_t)word;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return (size_t)x;
}

/* An object's number in a set: see the invariants above. */
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

/* An empty set with room for capacity / 2 chunks (a power of two); -1 out
   of memory. */
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

/* Adds op's number (its address >> ADDRESS_SHIFT): as bitset_add(). */
static inline int
bitset_add_object(BitSet *set, PyObject *op)
{
    return bitset_add(set, (uintptr_t)op >> ADDRESS_SHIFT);
}

#endif /* FORKSERVE_ADDRSET_H */
