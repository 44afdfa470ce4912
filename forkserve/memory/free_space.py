"""Keep a new worker's allocations off the master's pages: take the
allocators' free space in the master just before each fork.

    free_space.before_fork(cfg.take_free_space)   # in the master, nothing allocated after it
    pid = os.fork()

Why: a forked worker starts with the master's allocator state. pymalloc
hands out the free blocks of pools that also hold the master's objects
first, and glibc the free chunks between the master's data in its heap. Each
of those allocations writes to, and so copies, a page of the master's data:
the worker pays 4 KiB for a 64-byte dict. Taking that free space in the
master first sends the worker's allocations to fresh pools and to the top of
the heap. The figures (benchmarks/share_heap.py, the Django test shop) are
in docs/memory.md.

What it takes: the free blocks of the pymalloc pools in use and the free
chunks below the top of glibc's heap (forkserve.memory._free_space), up to
the budget. Neither the master nor a worker ever frees it.

Invariants and their reasons:

- Call it immediately before the fork: what is allocated after it may land
  in the space it freed up at the top, and what is freed after it is free
  space again.
- Never given back. Freeing it after the fork would write allocator headers
  into pages the master shares with its workers: the master would copy them,
  and each worker would be left holding the originals alone.
- Bounded. The first call takes at most BUDGET bytes (the holes loading the
  application left); the later calls (a respawn: what the master freed
  since, which it would otherwise have reused) at most BUDGET more in all,
  so a master that respawns workers for weeks does not grow without bound.
  After that a fork simply goes ahead.
- Checked at run time, before every take, against what is in effect, not
  what the environment asked for (refusal()): pymalloc is the object
  allocator with no hooks over it (debug hooks, from -X dev,
  PYTHONMALLOC=pymalloc_debug or a debug build, pad every block, so the
  free blocks counted are not the ones taken), tracemalloc is not tracing,
  and the malloc() linked at run time is glibc's (an LD_PRELOADed jemalloc
  or tcmalloc keeps no glibc heap). Otherwise nothing is taken, with one log
  line that says why and how to silence it.
- The count of free blocks is pymalloc's private text (the table
  sys._debugmallocstats() prints). The extension takes nothing when that
  table does not add up, and after a take it reads the table again; if the
  take missed free blocks or made new pools, no later take is made. Either
  way the log says so once.
"""

import dataclasses
import logging
import tracemalloc  # read before each take; imported with this module (the
                    # master's, before it shares its heap), not at the first fork

try:  # the take itself, in C: where it is not built, nothing is taken
    from forkserve.memory import _free_space as _EXTENSION
except ImportError:
    _EXTENSION = None

__all__ = ["BUDGET", "Allocators", "Taken", "before_fork", "read_allocators", "refusal"]

log = logging.getLogger("forkserve.error")

#: Bytes the first take may take, and the takes after it (respawns) together.
#: A bound, not a target: the Django test shop's first take was 1.2-1.4 MiB,
#: and 5.9 MiB with --share-heap after its logged-in warm-up (3.12).
BUDGET = 16 * 2 ** 20

SILENCE = "--no-take-free-space (take_free_space = False) silences this"


@dataclasses.dataclass(frozen=True)
class Taken:
    """What one call took: bytes of pymalloc blocks and of glibc heap chunks."""
    pool_bytes: int
    heap_bytes: int

    @property
    def total(self):
        return self.pool_bytes + self.heap_bytes


@dataclasses.dataclass(frozen=True)
class Allocators:
    """What a take depends on, as it is in effect now (read_allocators())."""
    extension: bool  # forkserve.memory._free_space is built
    allocator: str = "pymalloc"  # the object allocator: _free_space.allocator()
    tracing: bool = False  # tracemalloc is tracing
    glibc_malloc: bool = True  # malloc() as linked at run time is glibc's


def refusal(allocators):
    """Why no free space may be taken with these allocators, as a phrase; None
    if it may."""
    if not allocators.extension:
        return ("the C extension forkserve.memory._free_space is not built (reinstall "
                "forkserve where a C compiler and the Python headers are available)")
    if allocators.tracing:
        return "tracemalloc is tracing (PYTHONTRACEMALLOC, -X tracemalloc or tracemalloc.start())"
    if allocators.allocator == "pymalloc_debug":
        return ("Python's debug memory hooks are on (-X dev, PYTHONDEVMODE, "
                "PYTHONMALLOC=pymalloc_debug or a debug build of Python)")
    if allocators.allocator == "malloc":
        return "pymalloc is not the object allocator (PYTHONMALLOC=malloc)"
    if allocators.allocator != "pymalloc":
        return ("the object allocator is not plain pymalloc (PYTHONMALLOC=malloc_debug, or "
                "hooks such as a memory profiler's)")
    if not allocators.glibc_malloc:
        return ("malloc() is not glibc's (an LD_PRELOADed jemalloc or tcmalloc, or a C "
                "library other than glibc)")
    return None


def _extension():
    return _EXTENSION


def read_allocators():
    """The Allocators in effect in this process now."""
    extension = _extension()
    if extension is None:
        return Allocators(extension=False)
    return Allocators(extension=True, allocator=extension.allocator(),
                      tracing=tracemalloc.is_tracing(), glibc_malloc=extension.glibc_malloc())


class _State:
    first = None  # the first Taken in this process
    since_first = 0  # bytes taken by the calls after it
    stopped = False  # a take did not add up: no more
    said = None  # the refusal last logged


def before_fork(enabled=True, state=_State):
    """Take the allocators' free space before a worker's fork: a Taken, or None
    when nothing was taken (turned off, refused, or the budget is spent)."""
    budget = BUDGET if state.first is None else BUDGET - state.since_first
    if not enabled or state.stopped or budget <= 0:
        return None
    reason = refusal(read_allocators())
    if reason is not None:
        if reason != state.said:
            log.info("Not taking the allocators' free space before forking workers: %s; "
                     "workers may copy a few more of the master's pages. %s", reason, SILENCE)
            state.said = reason
        return None
    extension = _extension()
    try:
        pool_bytes, heap_bytes, missed, new_pools = extension.hold(budget)
    except extension.StatsError as exc:
        state.stopped = True
        log.warning("Not taking the allocators' free space before forking workers: pymalloc's "
                    "statistics did not add up (%s), so this Python's allocator is not one "
                    "forkserve was checked against. %s", exc, SILENCE)
        return None
    taken = Taken(pool_bytes, heap_bytes)
    if missed or new_pools:
        state.stopped = True
        log.warning("The take of the allocators' free space did not go as pymalloc's "
                    "statistics said (%s free blocks left, %s new pools made): no more takes "
                    "in this master. %s", missed if missed >= 0 else "unknown",
                    new_pools if new_pools >= 0 else "unknown", SILENCE)
    if state.first is None:
        state.first = taken
        log.debug("Took the free space between the master's objects before the first fork: "
                  "%d KiB in pymalloc pools, %d KiB in the heap",
                  taken.pool_bytes // 1024, taken.heap_bytes // 1024)
    else:
        state.since_first += taken.total
    return taken
