"""The log line for a response the server stopped sending: its client
stopped reading past send_timeout, or went away mid-body.

The access log's line is written as the response is handed over, so it says
200 and the full size of a download that was then cut; this line says what
went out. `CutLog` decides when to write one, as forkserve.http.shortage's
ShortageLog does: the first cut at once, then at most one line per
`interval`, which counts the cuts not logged since the last line. A client
that opens connections and never reads cannot fill the disk with them.
"""

from forkserve.http.h1 import escape

__all__ = ["CutLog"]


class CutLog:
    """Lines for cut responses, at most one per `interval`: `cut()` returns
    the line to log now, or None; `report()` logs it (WARNING, shown by
    default) to `logger`."""

    #: seconds between two lines
    interval = 10.0

    def __init__(self, clock, logger=None):
        self._clock = clock
        self._logger = logger
        self._last_line = None  # when the last line was logged
        self._unlogged = 0      # cuts since then without a line

    def cut(self, peer, line, sent, total, reason):
        """The response to the request `line` from `peer` stopped after `sent`
        body bytes of `total` (None: not known, a streamed body), because of
        `reason`."""
        now = self._clock()
        last = self._last_line
        if last is not None and now - last < self.interval:
            self._unlogged += 1
            return None
        self._last_line = now
        of = f"{sent:,} of {total:,}" if total is not None else f"{sent:,}"
        text = (f"response cut: {escape(line or '')} from {peer}, {of} body bytes sent: "
                f"{reason}")
        if self._unlogged:
            text += f" ({self._unlogged} more cut in the last {now - last:.0f} s, not logged)"
            self._unlogged = 0
        return text

    def report(self, peer, line, sent, total, reason):
        """cut(), and log the line if there is one."""
        text = self.cut(peer, line, sent, total, reason)
        if text is not None:
            self._logger.warning("%s", text)
