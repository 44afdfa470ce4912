"""A process's one stop state: whether it stops, how, and whether it gives up.

Every process keeps one StopState, its driver's (`Driver.stop_state`,
forkserve.process.driver): the master, the single server, the supervisor
and each worker. The driver hands it to its hand-over
(forkserve.process.handover) and the master to its workers' lifecycle
(forkserve.process.lifecycle) too, so none of them can disagree on whether
the process stops; `stopping`, draining and halting are read from it.

Invariants:
- `mode` is None until a stop is asked for (TERM: "graceful"; INT or QUIT:
  "fast"; a parent gone: "graceful"), then the strongest one asked for: a
  stop only ever gets faster, a second TERM or a TERM after an INT changes
  nothing (`ask` says whether it did).
- `handed_over`: the process's own generation has drained and a new one
  serves; the process becomes a supervisor (exec), so no stop can be asked
  of it any more. It is set only while `mode` is None.
- `halting`: the process gives up (exits.HaltServer) and kills its workers;
  they are told as in a fast stop, but the hand-over is not: a halt stops
  the generations itself (Driver.halt).
"""

__all__ = ["StopState", "DONE"]

#: `StopState.stopping` once the process has handed over
DONE = "done"


class StopState:
    __slots__ = ("mode", "handed_over", "halting")

    def __init__(self):
        self.mode = None          # None, "graceful" or "fast"
        self.handed_over = False  # the hand-over is done: this process becomes a supervisor
        self.halting = False      # a HaltServer is being carried out

    def under_way(self, mode) -> bool:
        """A stop at least as strong as `mode` was asked for already, or the
        process has handed over: asking for `mode` now would change nothing."""
        return self.handed_over or self.mode == "fast" or (self.mode is not None
                                                           and mode == "graceful")

    def ask(self, mode) -> bool:
        """A stop in `mode` ("graceful" or "fast"): True if it changes the
        stop under way (then `mode` is the one), False if it does not."""
        if self.under_way(mode):
            return False
        self.mode = mode
        return True

    @property
    def stopping(self):
        """None, the stop under way ("graceful" or "fast"), or DONE once the
        process has handed over."""
        return DONE if self.handed_over else self.mode

    @property
    def workers_told(self):
        """What a process's workers were told: None, "graceful" or "fast"
        (a halt kills them, as a fast stop does)."""
        return self.mode or ("fast" if self.halting else None)

    def __repr__(self):
        return (f"StopState(mode={self.mode!r}, handed_over={self.handed_over}, "
                f"halting={self.halting})")
