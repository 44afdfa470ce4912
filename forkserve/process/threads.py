"""The threads alive in the master when it forks a worker.

fork() copies only the thread that calls it. A lock that another thread held
at that moment (the allocator's, logging's, the import lock, a database
driver's) stays held for good in the worker, which deadlocks the first time
it takes it. A master that forks workers must therefore be single-threaded.
Python 3.12+ says so only with a DeprecationWarning, hidden by default, and
in a forkserve process not even that for C threads: it finds the thread
count by splitting /proc/self/stat on spaces, which a process title with a
space ("forkserve: master") shifts, and then counts threading's threads
alone. forkserve says it in its log instead: one warning, naming the count
and what to do, each time the count at a fork differs from the last one
warned about.

Invariants:

- The count is the kernel's ("Threads:" in /proc/self/status): it includes
  threads that Python's threading module never sees, such as C threads
  (faulthandler.dump_traceback_later's watchdog, a C library's pool).
  threading.active_count() is the fallback only where /proc is missing.
- Python's own warning (DeprecationWarning "This process ... is
  multi-threaded") is issued in the parent after the child exists. Made an
  error (-W error, PYTHONWARNINGS=error), 3.15 raises it from fork() in the
  parent (3.12-3.14 drop it): the child would run on with its pid lost, a
  worker nobody reaps or stops. unwarned() wraps the forks of forkserve's
  processes so that this one warning is ignored there; the log has said it.
- parse_count() and describe() are pure; count(), python_threads() and
  ThreadWatch read the process.
"""

import errno
import logging
import threading
import warnings

__all__ = ["ThreadWatch", "count", "describe", "parse_count", "python_threads", "unwarned"]

log = logging.getLogger("forkserve.error")

STATUS = "/proc/self/status"

# /proc/self/status cannot be read: not Linux, or /proc is not mounted.
_NO_PROC_ERRNOS = frozenset({errno.ENOENT, errno.ENOTDIR})


def parse_count(status_text):
    """The "Threads:" figure of a /proc/PID/status text, or None without one."""
    for line in status_text.splitlines():
        name, _, value = line.partition(":")
        if name == "Threads":
            return int(value)
    return None


def count(status=STATUS):
    """How many threads this process has (the kernel's count where /proc is)."""
    try:
        with open(status) as file:
            found = parse_count(file.read())
    except OSError as exc:
        if exc.errno not in _NO_PROC_ERRNOS:
            raise
        found = None
    return found if found is not None else threading.active_count()


def describe(threads, python_names):
    """The warning for a master about to fork a worker with `threads` threads,
    of which `python_names` (besides the forking one) are Python threads."""
    parts = []
    if python_names:
        parts.append(f"{len(python_names)} started by Python's threading module "
                     f"({', '.join(python_names)})")
    others = threads - 1 - len(python_names)
    if others > 0:
        parts.append(f"{others} not (C threads: faulthandler.dump_traceback_later's "
                     "watchdog, a numerical library's pool, a client library's I/O thread)")
    details = f", {' and '.join(parts)}" if parts else ""
    return (f"The master has {threads} threads alive as it forks a worker: "
            f"{threads - 1} besides its own{details}. A worker inherits only "
            "the forking thread, so a lock another thread held at that moment stays held "
            "in the worker and can deadlock it. Start threads in each worker (the post_fork "
            "or post_worker_init hook), not at import or in the master, or stop them "
            "before the workers start.")


class ThreadWatch:
    """Called right before each fork of a worker: warns once per new count."""

    def __init__(self, read=count):
        self.read = read
        self.warned = 1  # the count last warned about; 1 is the single-threaded master

    def before_fork(self):
        threads = self.read()
        if threads == self.warned:
            return
        self.warned = threads
        if threads > 1:
            log.warning("%s", describe(threads, python_threads()))


def python_threads():
    """The names of the threading module's threads that run on a system thread
    of their own (under gevent's patching a "thread" may be a greenlet)."""
    own = threading.get_native_id()
    return [thread.name for thread in threading.enumerate()
            if thread.native_id is not None and thread.native_id != own]


def unwarned(fork):
    """fork, with Python's multi-threaded-fork DeprecationWarning ignored for
    the call (see the invariants): it returns the child's pid, never raises it away."""
    def fork_unwarned():
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", r"This process \(pid=\d+\) is multi-threaded",
                                    DeprecationWarning)
            return fork()
    return fork_unwarned
