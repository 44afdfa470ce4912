"""--max-worker-memory, checked by the worker itself after each request.

The master reads every worker's private memory every couple of seconds
(smaps_rollup: the kernel walks the pages, ~12 ms per GiB mapped); a worker
that allocates fast goes far past the limit in between (a leak of 100 MB/s
was recycled at 514 MiB under a 200 MiB limit). So each worker also checks
itself after every response, cheaply, and asks to be recycled as soon as it
is over.

Invariants:

- The limit is on private memory as forkserve measures it everywhere
  (procfs.ProcessMemory.private: anonymous pages this process alone maps),
  and a worker is only ever recycled on an exact smaps reading of it.
- The reading after a response is /proc/PID/statm, read with one pread() on a
  descriptor opened once: resident anonymous memory, counters the kernel
  keeps, no page walk (about 2 us). It also counts the anonymous pages the
  worker still shares with the master (the preloaded heap), so it says
  nothing alone. What it adds is growth: the shared anonymous pages a
  worker maps never grow after fork (a copy turns a shared page private, it
  does not add one), so anonymous now, minus the shared anonymous part at
  the last exact reading, is a lower bound of private memory now. Before
  any exact reading the shared part is taken as 0, which makes the estimate
  an upper bound: below the limit, private memory is too.
- Only when the estimate passes the limit is smaps read; that reading
  resets the shared part, so an application that stays under the limit
  costs at most one smaps reading, and a leak one per recycle.
- Copies of shared pages do not raise the estimate (anonymous memory stays
  the same); the master's periodic reading still catches them.
"""

import os

from forkserve.memory import procfs

__all__ = ["MemoryLimit", "statm_reader"]


class MemoryLimit:
    """Decides, from injected readings, whether a worker is over its limit.

    `read_anonymous()` gives resident anonymous bytes (statm, cheap),
    `read_private()` private bytes (smaps, exact) or None if unknown.
    """

    def __init__(self, limit, read_anonymous, read_private):
        self.limit = limit
        self.read_anonymous = read_anonymous
        self.read_private = read_private
        #: anonymous bytes the worker shared at the last exact reading
        self.shared_anonymous = 0

    def over(self):
        """The private bytes if over the limit (an exact reading), else None."""
        anonymous = self.read_anonymous()
        if anonymous - self.shared_anonymous <= self.limit:
            return None
        private = self.read_private()
        if private is None:
            return None
        self.shared_anonymous = max(0, anonymous - private)
        return private if private > self.limit else None


def statm_reader(pid, *, proc=procfs.PROC):
    """A function returning `pid`'s resident anonymous bytes, and the
    descriptor it reads with (the caller closes it). One pread() a call."""
    fd = os.open(f"{proc}/{pid}/statm", os.O_RDONLY | os.O_CLOEXEC)
    page_size = os.sysconf("SC_PAGE_SIZE")

    def read():
        return procfs.parse_statm_anonymous(os.pread(fd, 256, 0), page_size)
    return read, fd
