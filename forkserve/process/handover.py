"""The reload state machine: which generation serves, which starts, which leaves.

Pure decisions, no I/O: every method takes an event (a HUP, a stop, a
generation's ready byte, a generation gone, the clock) and returns a list of
actions for the caller to carry out. The master (-w N), the single-process
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
  stop (Kill), then KILL_GRACE seconds more before SIGKILL (Kill hard): the
  reload always ends, even when a generation's loop is blocked.
- A generation that has not said it serves within `start_timeout`
  (START_TIMEOUT, 10 minutes, unless given) is forced out the same way and
  counts as a failed start, so HUPs queued behind it are not held forever.
- Once stopping, nothing starts, and the starting generation is stopped too;
  the generations told to stop get the same escalation (after
  `graceful_timeout` for TERM, at once for INT/QUIT), so a stop always ends.
- READY=1 is only told to systemd while a generation serves.
- `owner_serves`: the master and the single-process server are themselves
  the first serving generation. When their hand-over is done they become a
  supervisor (BecomeSupervisor); if the new generation dies while they
  drain, they serve again. The supervisor serves nothing itself: when no
  generation serves it starts one, and gives up after `max_failures`
  failed starts in a row.
"""

import dataclasses
import logging

__all__ = ["Handover", "Spawn", "Retire", "Kill", "Stop", "Notify", "Log",
           "BecomeSupervisor", "Halt"]

# --- actions: what the driver is asked to do, in order ---


@dataclasses.dataclass(frozen=True)
class Spawn:
    """Start generation `number` (fork + exec, adopting the listeners)."""
    number: int


@dataclasses.dataclass(frozen=True)
class Retire:
    """Generation `number` must drain and leave (SIGTERM)."""
    number: int


@dataclasses.dataclass(frozen=True)
class Kill:
    """Generation `number` overstayed its graceful timeout: force it out.

    First a fast stop (SIGQUIT: its master kills its own workers); `hard`
    when that was ignored for KILL_GRACE seconds: SIGKILL.
    """
    number: int
    hard: bool = False


@dataclasses.dataclass(frozen=True)
class Stop:
    """Stop the starting generation `number`; mode is "graceful" or "fast"."""
    number: int
    mode: str


@dataclasses.dataclass(frozen=True)
class Notify:
    """Tell systemd, e.g. "RELOADING=1"."""
    state: str


@dataclasses.dataclass(frozen=True)
class Log:
    level: int
    message: str


@dataclasses.dataclass(frozen=True)
class BecomeSupervisor:
    """The hand-over is done: exec into the supervisor of generation `number`
    (which tells systemd READY=1)."""
    number: int
    reload_again: bool


@dataclasses.dataclass(frozen=True)
class Halt:
    """Give up: no generation can start."""
    reason: str


IDLE, STARTING, RETIRING, STOPPING, DONE = "idle", "starting", "retiring", "stopping", "done"

#: seconds a generation gets after the fast stop (Kill) before SIGKILL (Kill hard)
KILL_GRACE = 5.0
#: seconds a generation may take to load and say it serves: generous, since
#: loading a large dataset takes minutes; past it, it is a failed start
START_TIMEOUT = 600.0


class ForceOut:
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
                    for number in numbers] + [Kill(number, hard=True) for number in numbers]
        self.killed, self.at = True, now + KILL_GRACE
        return [Log(logging.WARNING, f"Generation {number} {reason}; stopping it fast "
                                     f"(SIGKILL in {KILL_GRACE:g}s if it stays)")
                for number in numbers] + [Kill(number) for number in numbers]


class Handover:
    """One reload at a time, for one driver; see the module docstring."""

    def __init__(self, *, serving, graceful_timeout, owner_serves, max_failures=5,
                 reload_again=False, start_timeout=START_TIMEOUT):
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
        self.start_deadline = ForceOut()
        self.deadline = ForceOut()
        self.stopping = None
        #: generations told to stop and not gone yet, and when they are forced out
        self.stopped = set()
        self.stop_deadline = ForceOut()

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

    def stop_under_way(self, mode) -> bool:
        """A stop at least as strong as `mode` was asked for already (a second
        TERM, a TERM after an INT), or this process's hand-over is done: a
        stop(mode) now would change nothing."""
        return self.stopping in ("fast", DONE) or (self.stopping is not None
                                                   and mode == "graceful")

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

    def stop(self, mode, now) -> list:
        """TERM ("graceful") or INT/QUIT ("fast"): every other generation stops too.

        The driver stops its own workers itself; this stops the generations
        that are separate processes, the starting one included.
        """
        if self.stop_under_way(mode):
            return []
        self.stopping = mode
        self.reload_again = False
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
                                                   f"timeout ({self.graceful_timeout:g}s)"))

    # --- transitions ---

    def _spawn(self, now):
        self.latest += 1
        self.starting = self.latest
        self.start_deadline.arm(now + self.start_timeout)
        return [Spawn(self.latest)]

    def _done(self, now):
        """The reload is over: one generation serves."""
        if self.owner_serves:
            self.stopping = DONE  # nothing more happens in this process
            # exec_supervisor tells systemd READY=1 once it holds the signals,
            # so that a HUP sent right after READY is not lost in the exec.
            return [BecomeSupervisor(self.serving, self.reload_again)]
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

    def _forget(self, number):
        for name in ("starting", "retiring", "serving"):
            if getattr(self, name) == number:
                setattr(self, name, None)
