"""--share-heap: make the master's whole heap immortal before the first fork.

forkserve.share(obj) keeps one dataset shared; share_heap() does the same
for everything the master holds once the application is loaded, so that an
application that changes nothing still has workers that read without
writing reference counts into the master's pages. Call it in the master
after the application is loaded and before gc.freeze and the first fork
(forkserve.process.boot does, when --share-heap is on).

What it marks: every object reachable from sys.modules and from the
collector's lists (gc.get_objects(), after gc.unfreeze() so that what an
earlier share() froze is seen too): modules, types, functions, code objects,
instances, and the untracked objects they hold (str, bytes, int, float,
tuples). It caches str/bytes/frozenset hashes and the UTF-8 form of non-ASCII
str, as share() does. The C walker is forkserve.memory._immortal.share_heap;
its header comment says what it looks inside and what it never marks.

Invariants and their reasons:

- Immortal objects are never freed. A finaliser (__del__), a weakref
  callback or a close-on-free of any object that exists when share_heap()
  runs never runs, in the master or in a worker: files, sockets and
  generators left open in the master stay open until closed explicitly
  (close() works as before) or the process exits. Objects created after it
  (everything a worker allocates for a request) are ordinary objects.
- Only the master at boot calls it, once per process. A reload (HUP) starts
  a new master process and ends the old one, which frees everything.
- It refuses rather than half-works: on Python 3.11, free-threaded or debug
  builds, without the C extension, or when share()'s probe fails,
  `refusal()` says why and the server does not start (there is no pure
  Python walk of the whole heap: it would allocate while it walks, and take
  minutes on a large heap).

Still written on read after it, hence still copied by workers: the
specialisation caches inside code objects (co_code_adaptive, written as
bytecode warms up), type version tags and method caches, lazily created
instance dicts, and objects created after it. (The allocators' holes between
the master's objects are taken before each fork: forkserve.memory.free_space.)
"""

import gc
import sys
import time

from forkserve.memory import sharing

__all__ = ["refusal", "share_heap"]


def refusal():
    """Why --share-heap cannot work here, as a sentence; None if it can."""
    support = sharing.immortal_support()
    if support.value is None:
        reason = support.reason
    elif sharing.accelerator() is None:
        reason = ("the C extension forkserve.memory._immortal is not built (reinstall forkserve "
                  "where a C compiler and the Python headers are available)")
    else:
        return None
    return (f"--share-heap needs immortal objects (CPython 3.12 or 3.13, not free-threaded), "
            f"and here {reason}. Run forkserve on Python 3.12+, or keep a large dataset "
            "shared on any Python with forkserve.store.Store; or drop --share-heap.")


def share_heap(collect_first=False):
    """Mark the whole heap immortal; a sharing.ShareReport. Check refusal() first.

    collect_first: collect the cyclic garbage first (a warm-up's; measured to
    pay after a warm-up only: on the Flask shop without one, the workers
    ended 0.4-0.5 MiB larger with it)."""
    reason = refusal()
    if reason is not None:
        raise RuntimeError(reason)
    accelerator = sharing.accelerator()
    value = sharing.immortal_support().value
    started = time.perf_counter()
    with sharing.gc_paused():
        if collect_first:
            # The warm-up's cyclic garbage would be made immortal with the rest; freed
            # now, it leaves holes that the master takes before each fork (free_space).
            gc.collect()
        gc.unfreeze()  # what an earlier gc.freeze() holds is not in gc.get_objects()
        roots = gc.get_objects()
        roots.append(sys.modules)
        objects, size = accelerator.share_heap(roots, value, sharing.fill_utf8_cache)
        del roots
    gc.freeze()
    return sharing.ShareReport(objects, size, time.perf_counter() - started, True, "c")
