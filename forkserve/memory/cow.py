"""The memory discipline that keeps the master's pages shared with its workers.

After fork, a worker shares every page of the master until something writes
to it; then the kernel copies that page into the worker ("copy-on-write").
Reading a Python object writes to it (its reference count, and during a
garbage collection its GC header), so the discipline is about which writes
can be prevented, and when:

1. `begin_load()` runs before the application is imported: gc.disable(), so
   no collection runs while the dataset is being built. A collection during
   the load would free cyclic garbage and leave holes in pages that will be
   shared, and on a big dataset the collections themselves take seconds (the
   holes that remain are taken before each fork, forkserve.memory.free_space,
   so a worker's allocations do not fill them). It also registers the exit
   hook (4) as early as possible.
2. `harden()` runs in the master right before the first fork: gc.freeze()
   moves every tracked object into the permanent generation, which no
   collection ever examines, so a worker's GC never rewrites the headers of
   the master's objects. gc.set_threshold(0) then turns automatic collection
   off in a way that survives libraries calling gc.enable(). Each fork
   then takes the allocators' free space first (forkserve.memory.free_space),
   so a worker's allocations do not fill the holes between shared objects.
3. Workers inherit both, then apply their --worker-gc policy
   (forkserve.memory.workergc) through `set_worker_threshold()`: no policy
   collects the frozen heap, since no collection examines the permanent
   generation. `check()` restores the policy's threshold if a library
   changed it (with "off", cyclic garbage stays until the worker is
   recycled by --max-requests or --max-worker-memory).
4. Processes end through `exit_process()`: the application's atexit handlers
   run, logs and stdio are flushed, then os._exit. Interpreter finalization
   (a final collection and module teardown that touches every object, hence
   copies every shared page, and takes seconds on a big heap) never runs.
   The atexit hook registered in (1) is the safety net for exits that do
   not come through exit_process().

Reference counts are the one write this module cannot stop: that is what
forkserve.share() and forkserve.store are for.
"""

import atexit
import gc
import logging
import os
import sys

__all__ = ["begin_load", "harden", "check", "exit_process", "set_worker_threshold"]

log = logging.getLogger("forkserve.error")

_state = {"hook": False, "exiting": False, "threshold": (0, 10, 10)}


def begin_load():
    """Call before importing the application."""
    gc.disable()
    if not _state["hook"]:
        atexit.register(_exit_hook)
        _state["hook"] = True


def harden():
    """Call in the master after loading, right before forking workers."""
    gc.disable()
    gc.freeze()
    gc.set_threshold(0)
    gc.enable()  # harmless with threshold 0, and what libraries expect to find


def set_worker_threshold(threshold):
    """In a worker: the gc thresholds its --worker-gc policy chose."""
    _state["threshold"] = tuple(threshold)
    gc.set_threshold(*threshold)


def check():
    """Restore the worker's thresholds if something changed them (threshold 0
    unless a --worker-gc policy chose others). Returns True if it had to."""
    threshold = gc.get_threshold()
    if threshold != _state["threshold"]:
        gc.set_threshold(*_state["threshold"])
        log.warning("something set gc threshold to %s; forkserve set it back to %s "
                    "(--worker-gc)", threshold, _state["threshold"])
        return True
    return False


def exit_process(status: int = 0):
    """End this process: atexit handlers, flush, os._exit. Never returns."""
    _state["exiting"] = True
    try:
        atexit._run_exitfuncs()
    finally:
        _flush()
        os._exit(status)


def _exit_hook():
    """Safety net for exits that bypass exit_process(): skip finalization."""
    if _state["exiting"]:
        return  # exit_process() is running the handlers and will os._exit itself
    _flush()
    failed = getattr(sys, "last_value", None) is not None
    os._exit(1 if failed else 0)


def _flush():
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass  # closed or replaced stream: nothing left to flush
