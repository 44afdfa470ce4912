"""Spreading connections evenly over the workers that share a listener.

Workers race on accept(): left alone, the kernel's wake-up order decides,
and with keep-alive clients one worker of four can end up holding every
connection while others hold none (benchmarks/balance.py measures it). So
before each accept() a worker asks `may_accept()`: with the open
connections of every accepting (READY) worker of its scoreboard, would one
more leave it holding more than its fair share? If so it pauses, looking
again when one of its own connections ends or after `Admission.tick`
seconds (for its peers' changes), and the connection goes to a worker
below its share, which is waiting in accept().

A worker may run an eighth of its share ahead (`ceiling()`): taking
connections strictly in turn (A, B, A, B, ...) measured a higher p99 than
racing workers capped at the same even count, with 2 workers and 64 wrk
connections (docs/http.md has the figures); with the slack a client's
connections land in short runs per worker, as they do when workers race.

Invariants:
- Some accepting worker may always accept: the least loaded one holds at
  most total/n, below the share ceil((total + 1) / n), and the ceiling is
  at least the share. Pausing never leaves a connection without a
  taker, only waiting for one to run.
- No worker holds more than ceiling(total, n) (+1, below): the share plus
  an eighth of it, so at most ~1.13x the mean and one more, and exactly the
  share while it is below 8 (few connections).
- A connection is never refused or dropped by this module: a paused worker
  only defers its accept(). If a connection has waited in the listen queue
  `Admission.patience` seconds while this worker was paused (the worker
  below its share is blocked, e.g. by a CPU-bound request), this worker
  takes it anyway.
- A worker's decision may be stale by one connection (it checked, then
  waited in accept() while others took connections): it holds at most its
  share + 1.
- Counts are per scoreboard, so per generation: during a reload the old
  generation's workers have stopped accepting.
"""

__all__ = ["Admission", "ceiling", "fair_share", "may_accept"]


def fair_share(total, workers):
    """The most connections one of `workers` should hold once `total` are open."""
    return -(-total // workers)


#: a worker may hold its share plus 1/SLACK of it (rounded down)
SLACK = 8


def ceiling(total, workers):
    """The most connections one of `workers` may hold once `total` are open:
    its fair share, plus an eighth of it."""
    share = fair_share(total, workers)
    return share + share // SLACK


def may_accept(mine, others):
    """True if this worker, holding `mine` open connections while the other
    accepting workers hold `others` (a list of counts), may take one more."""
    return mine < ceiling(mine + sum(others) + 1, len(others) + 1)


class Admission:
    """The accept loop's side of the balance, in one worker (all its listeners).

    `admit(listener)` runs before each accept() (`wait_turn(listener)` is
    a greenlet's wait on it); `opened()` after each
    accepted connection, `closed()` when one ends. Counts go to the
    worker's scoreboard slot for its peers and for the master's reports.
    Built after fork, in the worker (it holds a gevent Event).
    """

    #: seconds between looks while paused: short next to a request, long
    #: enough that a paused worker costs next to nothing
    tick = 0.01
    #: seconds a connection may wait in the listen queue, while this worker
    #: is paused, before this worker takes it anyway (nobody else did)
    patience = 0.05

    def __init__(self, scoreboard, index, select, clock):
        self.scoreboard = scoreboard
        self.index = index
        self.open = 0
        self.accepted = 0
        self._select = select  # the unpatched select.select: a zero-timeout look
        self._clock = clock
        self._waiting_since = None  # when a connection was first seen waiting while paused
        from gevent.event import Event
        self._fewer = Event()  # set when one of this worker's connections ends

    def opened(self):
        self.open += 1
        self.accepted += 1
        self.scoreboard.set_connections(self.index, self.open, self.accepted)

    def closed(self, _greenlet=None):
        self.open -= 1
        self.scoreboard.set_connections(self.index, self.open, self.accepted)
        self._fewer.set()

    def admit(self, listener, pending=None):
        """True if this worker should accept its next connection now; if not,
        the caller looks again after `tick` seconds or when one of its
        connections ends. `pending`: True if a connection is known to wait
        in `listener`'s queue, None to look (only when over the share).
        Never switches: the server asks from the hub."""
        # holding none, a worker is never over its share: no need to read its peers'
        if not self.open or may_accept(self.open, self.scoreboard.loads(self.index)):
            self._waiting_since = None
            return True
        if pending is None:
            pending = self._pending(listener)
        if not pending:
            self._waiting_since = None
            return False
        now = self._clock()
        if self._waiting_since is None:
            self._waiting_since = now
            return False
        if now - self._waiting_since >= self.patience:
            self._waiting_since = None
            return True
        return False

    def wait_turn(self, listener):
        """Return when this worker should accept its next connection (a
        greenlet's wait on admit())."""
        while not self.admit(listener):
            self._fewer.clear()
            self._fewer.wait(self.tick)

    def _pending(self, listener):
        """True if a connection waits in the listen queue. (The listener is
        open: the server asks only while it accepts.)"""
        return bool(self._select([listener], [], [], 0)[0])
