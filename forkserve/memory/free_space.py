"""Keep a new worker's allocations off the master's pages: take the
allocators' free space in the master just before each fork.

    free_space.before_fork()     # in the master, nothing allocated after it
    pid = os.fork()

Why: a forked worker starts with the master's allocator state. pymalloc
hands out the free blocks of pools that also hold the master's objects
first, and glibc the free chunks between the master's data in its heap. Each
of those allocations writes to, and so copies, a page of the master's data:
the worker pays 4 KiB for a 64-byte dict. Taking that free space in the
master first sends the worker's allocations to fresh pools and to the top of
the heap. The figures (benchmarks/share_heap.py, the Django test shop) are
in docs/memory.md.

What it takes: every free block of every pymalloc pool in use and every free
chunk below the top of glibc's heap (forkserve.memory._free_space). Neither
the master nor a worker ever frees it.

Invariants and their reasons:

- Call it immediately before the fork: what is allocated after it may land
  in the space it freed up at the top, and what is freed after it is free
  space again.
- Never given back. Freeing it after the fork would write allocator headers
  into pages the master shares with its workers: the master would copy them,
  and each worker would be left holding the originals alone.
- Bounded. The first call takes the holes loading the application left;
  later calls (a respawn) take what the master freed since, which the master
  would otherwise have reused. Those later takes stop once they add up to
  RESPAWN_BUDGET bytes in one master, so a master that respawns workers for
  weeks does not grow without bound; after that a fork simply goes ahead.
- Best effort: without the C extension, with PYTHONMALLOC=malloc, or with
  another malloc than glibc's, nothing is taken and the fork goes ahead.
"""

import dataclasses
import logging

__all__ = ["RESPAWN_BUDGET", "Taken", "before_fork"]

log = logging.getLogger("forkserve.error")

#: Bytes the takes after a master's first fork may add up to.
RESPAWN_BUDGET = 16 * 2 ** 20


@dataclasses.dataclass(frozen=True)
class Taken:
    """What one call took: bytes of pymalloc blocks and of glibc heap chunks."""
    pool_bytes: int
    heap_bytes: int

    @property
    def total(self):
        return self.pool_bytes + self.heap_bytes


class _State:
    first = None  # the first Taken in this process
    since_first = 0  # bytes taken by the calls after it


def _extension():
    try:
        from forkserve.memory import _free_space
    except ImportError:
        return None
    return _free_space


def before_fork(state=_State):
    """Take the allocators' free space: a Taken, or None when nothing could
    be taken (no extension) or the respawn budget is spent."""
    extension = _extension()
    if extension is None:
        return None
    if state.first is not None and state.since_first >= RESPAWN_BUDGET:
        return None
    taken = Taken(*extension.hold())
    if state.first is None:
        state.first = taken
        log.debug("Took the free space between the master's objects before the first fork: "
                  "%d KiB in pymalloc pools, %d KiB in the heap",
                  taken.pool_bytes // 1024, taken.heap_bytes // 1024)
    else:
        state.since_first += taken.total
    return taken
