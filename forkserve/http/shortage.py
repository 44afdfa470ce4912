"""What a worker does when accept() fails for want of descriptors or memory.

Two decisions, both pure (a clock is passed in; no sockets):

- `ShortageLog` says when to log: the first failure at once, then at most one
  line per `interval` with the count since the last line, and one line when
  accepting works again. Without it every 0.1 s retry of every worker logged
  a line: 40 a second under `ulimit -n 256` and 1,500 held connections,
  enough to fill a disk during an attack.
- `oldest_heads` says which connections to shed when descriptors are short
  (EMFILE, ENFILE): those still sending their request head, oldest first. A
  client that sends its head at once is never among the oldest, so new
  clients no longer wait in the listen queue behind half-sent requests
  (slowloris) until the header timeout frees a descriptor. Connections whose
  request is being served, and idle keep-alive ones, are never shed; nor is
  one whose request waits in its socket unread (the server leaves those out
  of `waiting`: on a busy worker a request sent at once may not be read yet),
  nor one whose head began less than `MIN_WAIT` ago (its client may not have
  sent yet; shedding it for another new client only trades one for another).
"""

import errno

__all__ = ["ShortageLog", "oldest_heads", "DESCRIPTOR_ERRNOS", "MIN_WAIT", "SHED_BATCH"]

#: accept() failures that shedding a connection's descriptor can cure
DESCRIPTOR_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE})

#: connections shed per failed accept(), which is retried at once after: the
#: accept needs one descriptor, and shedding more would close connections that
#: no new client is waiting for
SHED_BATCH = 1

#: seconds a head must have been awaited before its connection may be shed.
#: Short: new clients queued behind a listen backlog of half-sent heads get in
#: after the backlog is churned through, a batch per MIN_WAIT; not zero: a
#: connection accepted a moment ago, its client's request not yet arrived on a
#: loaded machine, was seen shed for the next new client.
MIN_WAIT = 0.25


def oldest_heads(waiting, count, now, min_wait=MIN_WAIT):
    """The `count` oldest of `waiting`, (started, connection) pairs of the
    connections still waiting for their request head, that have waited at
    least `min_wait` seconds by `now`."""
    if count <= 0:
        return []
    old = [pair for pair in waiting if now - pair[0] >= min_wait]
    return [connection for _, connection in sorted(old, key=lambda pair: pair[0])[:count]]


class ShortageLog:
    """Counts failed accepts and shed connections; `failed()` and `accepted()`
    return the line to log now, or None. At most one line per `interval`,
    whatever the failures and recoveries in between: the counts say the rest."""

    #: seconds between two lines
    interval = 10.0

    def __init__(self, clock):
        self._clock = clock
        self._last_line = None   # when the last line was logged
        self._short = False      # a failure not yet followed by "accepting again"
        self._failures = 0       # since the last line
        self._shed = 0

    def failed(self, reason, shed):
        """accept() failed with `reason` (its strerror) and `shed` connections
        were shed for it."""
        self._short = True
        self._failures += 1
        self._shed += shed
        return self._line(f"cannot accept connections: {reason}")

    def accepted(self):
        """accept() worked: once the interval allows, say so (with the counts)."""
        if not self._short:  # the usual case: nothing to say
            return None
        line = self._line("accepting connections again")
        if line is not None:
            self._short = False
        return line

    def _line(self, what):
        now = self._clock()
        last = self._last_line
        if last is not None and now - last < self.interval:
            return None
        self._last_line = now
        failures, shed = self._failures, self._shed
        self._failures = self._shed = 0
        if not failures:
            return what
        counts = f"{failures} failed accept(s)"
        if last is not None:
            counts += f" in the last {now - last:.0f} s"
        if shed:
            counts += f", {shed} incomplete request head(s) shed, oldest first"
        return (f"{what} ({counts}); raise the open-files limit (ulimit -n, LimitNOFILE=) "
                "or lower --worker-connections")
