"""Sharing the master's whole heap (on by default; --no-share-heap turns it off).

forkserve.share(obj) keeps one dataset shared; share_heap() does the same
for everything the master holds once the application is loaded, so that an
application that changes nothing has workers that read without writing
reference counts into the master's pages. The master calls it after the
application is loaded (and warmed up) and before gc.freeze and the first
fork (forkserve.process.boot).

What it marks: every object reachable from sys.modules and from the
collector's lists (gc.get_objects(), after gc.unfreeze() so that what an
earlier share() froze is seen too): modules, types, functions, code objects,
instances, and the untracked objects they hold (str, bytes, int, float,
tuples). It caches str/bytes/frozenset hashes (tuples too from 3.14) and the
UTF-8 form of non-ASCII str, as share() does. The C walker is
forkserve.memory._immortal.share_heap; its header comment says what it looks
inside and what it never marks.

Invariants and their reasons:

- Finalisers keep their meaning. An object whose death can run code or
  release something outside Python's data (a finaliser, a generator or
  coroutine in any state, a greenlet, a buffer view, a weakref's referent,
  an OS resource), or whose references the walk cannot see (a C type the
  collector does not track, unless named plain data), or that holds a frame,
  stays mortal, and so does every object from which one is reachable through
  data: a worker that drops an object made at import still closes its file
  and runs its __del__, as without sharing (_immortal.c states the rule).
  Modules, classes, functions and code objects live as long as the program
  and are made immortal whatever they hold. The report counts what stayed
  mortal, by type, and names the seeds that kept the most of it mortal.
- Everything else is never freed, in the master or in a worker, nor is what a
  worker stores in it: a container made at import keeps a worker's entries
  after the worker replaces it. keep_mortal(obj) (forkserve.keep_mortal)
  leaves obj and the data it holds out, for such a cache.
- Only the master at boot calls it, once per process. A reload (HUP) starts
  a new master process and ends the old one, which frees everything.
- Where marking was not checked (3.11, 3.16+, free-threaded or debug builds,
  no C extension, a failed probe), `unavailable()` says why: the default
  logs that line and goes on with gc.freeze alone; an explicit --share-heap
  refuses to start.

Still written on read after it, hence still copied by workers: the
specialisation caches inside code objects (co_code_adaptive, written as
bytecode warms up), type version tags and method caches, lazily created
instance dicts, the objects kept mortal, and objects created after it.
"""

import gc
import logging
import sys
import time

from forkserve.memory import sharing

__all__ = ["keep_mortal", "last_report", "off_message", "refusal", "share_heap", "unavailable"]

_last = {"report": None}  # this process's share_heap() report, for --why
_asked = []  # what keep_mortal() was given, until share_heap() runs (then let go)


def keep_mortal(obj):
    """Keep obj, and everything it holds but modules, classes, functions and
    code, mortal when the heap is shared: a worker that drops or replaces it
    frees it, and what the worker put into it. A module: its globals. Call
    before the heap is shared (at import, or in a pre_freeze hook); returns obj."""
    _asked.append(obj)
    return obj


def unavailable():
    """Why the heap cannot be shared here, as a clause; None if it can."""
    support = sharing.immortal_support()
    return None if support.ok else support.reason


def off_message():
    """(logging level, message) saying that the default will not share the heap
    here and why, or None if it will. INFO where this Python cannot (3.11, a
    debug build); WARNING where it should but the probe failed (a fork that
    failed or a child that did not answer), with what to do."""
    support = sharing.immortal_support()
    if support.ok:
        return None
    message = (f"Heap sharing off: {support.reason}; workers copy the pages of what "
               "they read (gc.freeze still keeps collections off the master's objects)")
    if not support.fault:
        return logging.INFO, message
    return logging.WARNING, (f"{message}. Restart the server once the machine can fork "
                             "(free memory, a process limit not reached) to share the "
                             "heap, or pass --no-share-heap to start without sharing and "
                             "without this warning")


def refusal():
    """Why an explicit --share-heap cannot start here, as a sentence; None if it can."""
    reason = unavailable()
    if reason is None:
        return None
    return (f"--share-heap needs immortal objects (CPython 3.12 to 3.15, 64-bit, not "
            f"free-threaded), and here {reason}. Run forkserve on one of those, or keep a "
            "large dataset shared on any Python with forkserve.store.Store; or drop "
            "--share-heap (the default shares the heap where it can).")


def share_heap(collect_first=False):
    """Mark the whole heap immortal but for the mortality rule; a
    sharing.ShareReport. Check unavailable() first.

    collect_first: collect the cyclic garbage first (a warm-up's; measured to
    pay after a warm-up only: on the Flask shop without one, the workers
    ended 0.4-0.5 MiB larger with it)."""
    reason = unavailable()
    if reason is not None:
        raise RuntimeError(refusal())
    accelerator = sharing.accelerator()
    started = time.perf_counter()
    with sharing.gc_paused():
        if collect_first:
            # The warm-up's cyclic garbage would be made immortal with the rest; freed
            # now, it leaves holes that the master takes before each fork (free_space).
            gc.collect()
        gc.unfreeze()  # what an earlier gc.freeze() holds is not in gc.get_objects()
        roots = gc.get_objects()
        roots.append(sys.modules)
        try:
            result = accelerator.share_heap(roots, sharing.known_types(),
                                            sharing.fill_utf8_cache, _asked)
        finally:
            _asked.clear()  # else the list would keep them alive for good
        del roots
    gc.freeze()
    _last["report"] = sharing.report_of(result, started)
    return _last["report"]


def last_report():
    """The ShareReport of this process's share_heap() (a worker's and an
    auditor's are the master's, inherited), or None if it did not run."""
    return _last["report"]
