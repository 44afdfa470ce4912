"""Progress while the master loads the application.

A dataset load can take tens of seconds of pure CPU work that never yields
(to gevent or anything else); a user watching the log must see that it is
alive. `loading()` logs "loading APP", then every `interval` seconds the
elapsed time and the master's RSS, then "loaded APP in X s (RSS Y MB)".

Invariants, and why:
- No thread: an interval timer (setitimer, SIGALRM) interrupts the main
  thread, and the interpreter runs the handler at the next bytecode even in
  a pure-Python loop that never yields to gevent. So nothing is left to
  inherit at fork, and nothing runs beside the import: no lock can be held
  by another thread when the heap is frozen and forked (a reporter thread
  would also leave a dummy entry in threading's table, via logging).
- The handler is the exception to "signal handlers only enqueue": there is
  no loop to dispatch to while the import runs. It only reads
  /proc/self/statm and logs one line; it touches none of the application's
  objects.
- The timer and the previous SIGALRM handler are restored before
  `loading()` returns, so before cow.harden() and before any fork, unless
  the application installed its own SIGALRM handler while loading: then
  its handler and its timer (there is one ITIMER_REAL) are left as it set
  them.
- A C call that holds the interpreter for seconds (one huge json.loads)
  delays the line until it returns; pure-Python loops do not.
"""

import contextlib
import logging
import os
import time

__all__ = ["loading", "rss_bytes", "format_progress"]

log = logging.getLogger("forkserve.error")

_PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_bytes(pid="self"):
    try:
        with open(f"/proc/{pid}/statm") as handle:
            return int(handle.read().split()[1]) * _PAGE
    except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
        return None


def format_progress(name, seconds, rss, done=False):
    """The log line (pure, for tests)."""
    memory = f"RSS {rss / 2**20:.0f} MB" if rss is not None else "RSS unknown"
    if done:
        return f"loaded {name} in {seconds:.1f} s ({memory})"
    return f"still loading {name}: {seconds:.1f} s, {memory}"


@contextlib.contextmanager
def loading(name, interval=5.0):
    """Log the load of `name`; every `interval` seconds (0: never) while it runs."""
    started = time.monotonic()
    log.info("loading %s", name)
    stop = None
    if interval > 0:
        stop = _start_reporter(name, started, interval)
    try:
        yield
    finally:
        if stop is not None:
            stop()
    log.info("%s", format_progress(name, time.monotonic() - started, rss_bytes(), done=True))


def _start_reporter(name, started, interval):
    import signal

    def report(signum, frame):
        log.info("%s", format_progress(name, time.monotonic() - started, rss_bytes()))

    previous = signal.signal(signal.SIGALRM, report)
    signal.setitimer(signal.ITIMER_REAL, interval, interval)

    def stop():
        if signal.getsignal(signal.SIGALRM) is not report:
            # The application took SIGALRM over while it loaded (its own
            # handler, and the one real-time timer with it): leave both.
            log.info("%s installed its own SIGALRM handler while loading; load progress "
                     "lines stopped there", name)
            return
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)

    return stop
