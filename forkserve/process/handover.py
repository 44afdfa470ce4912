"""The reload state machine: which generation serves, which starts, which leaves.

Pure decisions, no I/O: every method takes an event (a HUP, a stop, a
generation's ready byte, a generation gone, the clock) and returns a list of
actions (forkserve.process.actions) for the caller to carry out. The master (-w N), the single-process
server (-w 0) and the supervisor are thin drivers around it.

    idle --HUP--> starting --ready--> retiring --old gone--> idle
                    |                    |
                    +-- new died --------+-- new died --> idle (owner serves
                        (reload failed:       again) or starting (supervisor:
                        old keeps serving)    nobody serves, start another)

Invariants:
- At most two generations at a time: the serving one and one starting (or,
  during retiring, the new one serving and the old one draining). A HUP
  that arrives during a reload is remembered and done once it is over: a
  reload never starts while a generation drains.
- A generation only retires once the next one said it serves, so a
  generation that fails to start costs nothing but the log line.
- The old generation gets `graceful_timeout` (+1 s) to drain, then a fast
  stop (ForceOut), then KILL_GRACE seconds more before SIGKILL (ForceOut
  hard): the reload always ends, even when a generation's loop is blocked.
- A generation that has not said it serves within `start_timeout`
  (START_TIMEOUT, 10 minutes, unless given) is forced out the same way and
  counts as a failed start, so HUPs queued behind it are not held forever.
- Once stopping, nothing starts, and the starting generation is stopped too;
  the generations told to stop get the same escalation (after
  `graceful_timeout` for TERM, at once for INT/QUIT), so a stop always ends.
- READY=1 is only told to systemd while a generation serves.
- TTIN and TTOU (`resize`) are for the generation that will serve: while
  one starts they are counted, and once it serves it gets them (the one that
  drains would take them away with it); after a failed start the serving one
  gets them. They reach another process as signals (Forward), one at a time,
  FORWARD_PACE apart, because standard signals sent back to back coalesce:
  the receiver may see one of several.
- `owner_serves`: the master and the single-process server are themselves
  the first serving generation. When their hand-over is done they become a
  supervisor (BecomeSupervisor); if the new generation dies while they
  drain, they serve again. The supervisor serves nothing itself: when no
  generation serves it starts one, and gives up after `max_failures`
  failed starts in a row.
"""

import logging
import signal

from forkserve.process.actions import (BecomeSupervisor, ForceOut, Forward, Halt, Log, Notify,
                                       Retire, Spawn, Stop)
from forkserve.process.stop_state import StopState

__all__ = ["Handover"]

IDLE, STARTING, RETIRING, STOPPING = "idle", "starting", "retiring", "stopping"

#: seconds a generation gets after the fast stop (ForceOut) before SIGKILL (ForceOut hard)
KILL_GRACE = 5.0
#: seconds a generation may take to load and say it serves: generous, since
#: loading a large dataset takes minutes; past it, it is a failed start
START_TIMEOUT = 600.0
#: seconds between two TTIN/TTOU forwarded to one generation, so that its
#: master sees each (standard signals that arrive before the first is handled
#: coalesce into one)
FORWARD_PACE = 0.2


class Escalation:
    """When a generation is forced out: at `at` the fast stop, KILL_GRACE later SIGKILL."""

    def __init__(self):
        self.at = None
        self.killed = False  # the fast stop was sent: `at` is SIGKILL's

    def arm(self, at):
        self.at, self.killed = at, False

    def clear(self):
        self.at, self.killed = None, False

    def due(self, now, numbers, reason) -> list:
        """The actions due at `now` for generations `numbers` (a reason: why they go)."""
        if not numbers or self.at is None or now <= self.at:
            return []
        if self.killed:
            self.at = None  # nothing stronger than SIGKILL: wait for them to be gone
            return [Log(logging.ERROR, f"Generation {number} is still there {KILL_GRACE:g}s "
                                       "after the fast stop; sending SIGKILL")
                    for number in numbers] + [ForceOut(number, hard=True) for number in numbers]
        self.killed, self.at = True, now + KILL_GRACE
        return [Log(logging.WARNING, f"Generation {number} {reason}; stopping it fast "
                                     f"(SIGKILL in {KILL_GRACE:g}s if it stays)")
                for number in numbers] + [ForceOut(number) for number in numbers]


class Handover:
    """One reload at a time, for one driver; see the module docstring."""

    def __init__(self, *, serving, graceful_timeout, owner_serves, max_failures=5,
                 reload_again=False, start_timeout=START_TIMEOUT, workers=0, stop_state=None):
        #: the number of the generation that serves (None: none does)
        self.serving = serving
        #: the generation started and not yet ready
        self.starting = None
        #: the generation draining after its successor said it serves
        self.retiring = None
        #: the highest generation number used so far
        self.latest = serving
        self.graceful_timeout = graceful_timeout
        self.owner_serves = owner_serves
        #: the generation this process is (master, single), or None (supervisor)
        self.owner = serving if owner_serves else None
        self.max_failures = max_failures
        self.reload_again = reload_again
        self.failures = 0
        self.start_timeout = start_timeout
        #: when the starting generation (it loads too long) and the retiring
        #: one (it drains too long) are forced out
        self.start_deadline = Escalation()
        self.deadline = Escalation()
        #: the process's one stop state (forkserve.process.stop_state), its
        #: driver's: the master shares it with its workers' lifecycle
        self.stop_state = StopState() if stop_state is None else stop_state
        #: generations told to stop and not gone yet, and when they are forced out
        self.stopped = set()
        self.stop_deadline = Escalation()
        #: TTIN (+1) and TTOU (-1) received while a generation starts, for it
        self.pending_workers = 0
        #: TTIN/TTOU still to forward to generation `forward_to`, one per
        #: FORWARD_PACE from `forward_at` on
        self.forward_to = serving if workers else None
        self.forward_left = workers
        self.forward_at = 0.0

    @property
    def stopping(self):
        """None, the stop under way ("graceful" or "fast"), or DONE once this
        process has handed over (read from the stop state)."""
        return self.stop_state.stopping

    @property
    def state(self):
        if self.stopping:
            return STOPPING
        if self.retiring is not None:
            return RETIRING
        if self.starting is not None:
            return STARTING
        return IDLE

    @property
    def busy(self) -> bool:
        """A reload is under way (a generation starts or drains)."""
        return self.starting is not None or self.retiring is not None

    # --- events ---

    def hup(self, now) -> list:
        if self.stopping:
            return [Log(logging.INFO, "Hang up ignored: stopping")]
        if self.busy:
            self.reload_again = True
            return [Log(logging.INFO, "Hang up during a reload: reloading again once it "
                                      "is done")]
        return [Log(logging.INFO, "Hang up: reloading the application in a new generation"),
                Notify("RELOADING=1"), *self._spawn(now)]

    def begin(self, now) -> list:
        """The driver starts: a HUP that came during the previous hand-over is done now."""
        if self.reload_again and not self.busy and not self.stopping:
            self.reload_again = False
            return [Log(logging.INFO, "Reloading again (a hang up came during the reload)"),
                    Notify("RELOADING=1"), *self._spawn(now)]
        return []

    def resize(self, delta, now) -> list:
        """TTIN (`delta` 1) or TTOU (-1): for the starting generation once it
        serves, else for the serving one (Forward)."""
        name = "TTIN" if delta > 0 else "TTOU"
        if self.stopping:
            return [Log(logging.INFO, f"{name} ignored: stopping")]
        if self.starting is not None:
            self.pending_workers += delta
            return [Log(logging.INFO, f"{name} during a reload: generation {self.starting} "
                                      f"gets {_workers(self.pending_workers)} once it serves")]
        if self.serving is None:
            return [Log(logging.WARNING, f"{name} ignored: no generation serves")]
        return self._forward(self.serving, delta, now)

    def forward_wait(self, now):
        """Seconds until the next TTIN/TTOU is due for forwarding, or None."""
        if not self.forward_left or self.stopping:
            return None
        return max(0.0, self.forward_at - now)

    def stop(self, mode, now) -> list:
        """TERM ("graceful") or INT/QUIT ("fast"): every other generation stops too.

        The driver stops its own workers itself; this stops the generations
        that are separate processes, the starting one included.
        """
        if not self.stop_state.ask(mode):
            return []
        self.reload_again = False
        self.pending_workers = self.forward_left = 0
        numbers = [number for number in (self.retiring, self.serving, self.starting)
                   if number is not None and number != self.owner]
        self.stopped.update(numbers)
        grace = self.graceful_timeout + 1.0 if mode == "graceful" else 1.0
        if self.stop_deadline.at is None or now + grace < self.stop_deadline.at:
            self.stop_deadline.arm(now + grace)
        return [Stop(number, mode) for number in numbers]

    def ready(self, now) -> list:
        """The starting generation wrote its ready byte."""
        if self.starting is None or self.stopping:
            return []
        new, old = self.starting, self.serving
        self.starting, self.serving, self.failures = None, new, 0
        self.start_deadline.clear()
        actions = [Log(logging.INFO, f"Generation {new} serves"
                                     + (f"; draining generation {old}" if old else ""))]
        actions += self._forward_pending(new, now)
        if old is None:
            return actions + self._done(now)
        self.retiring = old
        self.deadline.arm(now + self.graceful_timeout + 1.0)
        return actions + [Retire(old)]

    def gone(self, number, description, now) -> list:
        """Generation `number` has left: its process exited or its workers drained."""
        if self.stopping:
            self._forget(number)
            self.stopped.discard(number)
            return [Log(logging.INFO, f"Generation {number} {description}")]
        if number == self.starting:
            return self._start_failed(number, description, now)
        if number == self.retiring:
            self.retiring = None
            self.deadline.clear()
            return [Log(logging.INFO, f"Generation {number} {description}"), *self._done(now)]
        if number == self.serving:
            return self._serving_died(number, description, now)
        return [Log(logging.INFO, f"Generation {number} {description}")]

    def tick(self, now) -> list:
        """The clock moved: a generation past its deadline is forced out, fast
        stop first, SIGKILL KILL_GRACE seconds later."""
        if self.stopping:
            return self.stop_deadline.due(now, sorted(self.stopped), "has not stopped")
        starting = [self.starting] if self.starting is not None else []
        retiring = [self.retiring] if self.retiring is not None else []
        return (self.start_deadline.due(now, starting, "did not say it serves within "
                                                       f"{self.start_timeout:g}s of its start")
                + self.deadline.due(now, retiring, "did not finish within the graceful "
                                                   f"timeout ({self.graceful_timeout:g}s)")
                + self._forward_due(now))

    # --- transitions ---

    def _spawn(self, now):
        self.latest += 1
        self.starting = self.latest
        self.start_deadline.arm(now + self.start_timeout)
        return [Spawn(self.latest)]

    def _done(self, now):
        """The reload is over: one generation serves."""
        if self.owner_serves:
            self.stop_state.handed_over = True  # nothing more happens in this process
            # exec_supervisor tells systemd READY=1 once it holds the signals,
            # so that a HUP sent right after READY is not lost in the exec.
            left = self.forward_left if self.forward_to == self.serving else 0
            return [BecomeSupervisor(self.serving, self.reload_again, left)]
        if self.serving is None:  # the new one died too: another starts (_serving_died)
            return self.begin(now)
        return [Notify("READY=1"), *self.begin(now)]

    def _start_failed(self, number, description, now):
        self.starting = None
        self.start_deadline.clear()
        self.failures += 1
        if self.serving is not None:
            actions = [Log(logging.ERROR, f"Reload failed: generation {number} {description} "
                                          "before it was ready; the previous generation "
                                          "keeps serving")]
            actions += self._forward_pending(self.serving, now)  # its TTIN/TTOU: to this one
            # The reload is over and the old generation serves; a HUP that
            # came meanwhile (perhaps with the fix) is tried now.
            return actions + [Notify("READY=1"), *self.begin(now)]
        actions = [Log(logging.ERROR, f"Generation {number} {description} before it was "
                                      f"ready ({self.failures} in a row)")]
        if self.failures >= self.max_failures:
            return actions + [Halt("no generation could start; see the errors above")]
        return actions + self._spawn(now)

    def _serving_died(self, number, description, now):
        self.serving = None
        if self.retiring is not None and self.owner_serves:
            # The new generation died while ours drained: we serve again.
            self.serving, self.retiring = self.retiring, None
            self.deadline.clear()
            return [Log(logging.ERROR, f"Generation {number} {description} after it took "
                                       f"over; generation {self.serving} serves again")]
        actions = [Log(logging.ERROR, f"Generation {number} {description}; starting a new "
                                      "one")]
        if self.starting is not None:
            return actions  # already starting one
        return actions + self._spawn(now)

    def _forward_pending(self, number, now):
        """The TTIN/TTOU counted while a generation started, for `number` now."""
        delta, self.pending_workers = self.pending_workers, 0
        if not delta:
            return []
        return [Log(logging.INFO, f"Generation {number} gets the {_workers(delta)} asked for "
                                  "during the reload"), *self._forward(number, delta, now)]

    def _forward(self, number, delta, now):
        if number == self.owner:  # this process's own workers: no signal to coalesce
            return [Forward(number, signal.SIGTTIN if delta > 0 else signal.SIGTTOU)
                    for _ in range(abs(delta))]
        if self.forward_to != number:  # what was left for another generation left with it
            self.forward_to, self.forward_left = number, 0
        self.forward_left += delta
        return self._forward_due(now)

    def _forward_due(self, now):
        """One TTIN/TTOU, if one is left and FORWARD_PACE has passed since the last."""
        left = self.forward_left
        if not left or self.stopping or now < self.forward_at:
            return []
        self.forward_left -= 1 if left > 0 else -1
        self.forward_at = now + FORWARD_PACE
        return [Forward(self.forward_to, signal.SIGTTIN if left > 0 else signal.SIGTTOU)]

    def _forget(self, number):
        for name in ("starting", "retiring", "serving"):
            if getattr(self, name) == number:
                setattr(self, name, None)


def _workers(delta):
    """'2 workers more', '1 worker fewer', 'no change in workers'."""
    if not delta:
        return "no change in workers"
    count = abs(delta)
    return f"{count} worker{'s' if count != 1 else ''} {'more' if delta > 0 else 'fewer'}"
