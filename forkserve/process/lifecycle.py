"""The workers' lifecycle as the master sees it: a pure state machine.

Events in (a worker was forked, its scoreboard slot was read, it exited, the
clock moved, a stop or a recycle was asked for), actions out (fork one,
signal one, log, halt, announce readiness: forkserve.process.actions). No
process, no clock, no scoreboard here: the master reads those and carries
out the actions (forkserve.process.driver's `apply`), so every rule below
is a unit test without fork (tests/test_lifecycle.py).

A worker's states: booting (forked, has not said it serves), ready (serving,
counted towards the target), retiring (being replaced: its replacement is
forked; it still serves, and accepts, until that one says it serves),
stopping (sent TERM or QUIT, with a deadline after which it gets SIGKILL).

Recycling (--max-requests, --max-worker-memory, HUP under a supervisor): a
worker that asks, or is found over, is queued (`asked_at`) and goes on
serving as if nothing happened. Recycles run one at a time, in the order
asked: the next queued worker becomes retiring, and its replacement is
forked, once no other is retiring, that is once the previous replacement
said it serves (its worker was then told to drain: TERM). Workers that all
reach --max-requests in the same second (connections spread evenly count
alike) are thus replaced one after the other, a replacement's boot apart,
with never fewer than the target accepting. A replacement slow to boot
holds up the queue for at most `recycle_overlap` seconds; then the next
recycle starts beside it. Two recycles start at least `recycle_interval`
apart: a recycle costs a fork and a boot of CPU (about 10 ms, measured),
so under sustained load at a low --max-requests the recycles would
otherwise take most of a CPU; a worker waiting its turn serves on, past
its --max-requests (a soft limit, as in Gunicorn).

A worker has two numbers. Its scoreboard slot (`index`) is wherever a slot
was free when it was forked: a replacement starts while the worker it
replaces still holds its slot. Its `number` (worker_id, shown in logs,
process titles and Prometheus labels) is its place in the pool, 1 to the
number of workers: a replacement takes the number of the worker it
replaces, so a recycle leaves the set of numbers, and the metric series
keyed by them, as they were.

Invariants:
- Booting and ready workers count towards the target, so a retiring one is
  replaced before it is stopped ("replacement first"), and it is stopped
  only once the workers that serve without it are `target` ready ones.
- At most one worker is retiring at a time, unless the newest retiring one
  has waited `recycle_overlap` seconds for its replacement.
- Two recycles start at least `recycle_interval` seconds apart.
- A worker is ready once its own slot says so, whether the master reads the
  slot on a turn or only after the worker has exited.
- Only real boot failures (exit WORKER_BOOT_ERROR: the application or a
  worker hook raised) count towards halting, `max_boot_failures` in a row.
  Any exit before ready (a boot failure, a kill, a lack of descriptors)
  delays the next fork by a backoff that doubles up to `max_backoff`; a
  worker that has served is replaced at once. A worker ready resets both.
"""

import logging
import signal

from forkserve.process.actions import Announce, Fork, Halt, Kill, Log
from forkserve.process.stop_state import StopState

#: Doublings of the boot backoff counted at most (2**30 x 0.1 s is far past
#: any max_backoff).
_MAX_DOUBLINGS = 30

__all__ = ["Lifecycle", "WorkerRecord"]


class WorkerRecord:
    """One forked worker, as the master knows it."""

    __slots__ = ("index", "pid", "state", "ready", "deadline", "expected_exit", "generation",
                 "number", "asked_at", "retiring_since")

    def __init__(self, index, pid, generation, number=None):
        self.index = index
        self.number = index + 1 if number is None else number
        self.pid = pid
        self.state = "booting"     # booting, ready, retiring, stopping
        self.ready = False
        self.deadline = None       # when a stopping worker gets SIGKILL
        self.expected_exit = False
        self.generation = generation
        self.asked_at = None       # when it asked to be recycled (or was found over)
        self.retiring_since = None  # when its replacement was asked for

    @property
    def worker_id(self):
        return self.number

    @property
    def counts_towards_target(self):
        return self.state in ("booting", "ready")

    def __str__(self):
        return f"Worker {self.worker_id} (pid {self.pid})"


class Lifecycle:
    #: consecutive boot failures (workers exiting WORKER_BOOT_ERROR: the
    #: application or a worker hook raised) after which the master gives up
    max_boot_failures = 5
    #: first delay before replacing a worker that ended before it was ready
    #: (a boot failure, a kill, a lack of file descriptors); doubles each time
    boot_backoff = 0.1
    #: the longest such delay: workers killed as they start (the OOM killer)
    #: are retried this often for as long as it lasts, never given up on
    max_backoff = 2.0
    #: seconds a recycle may wait for its replacement to say it serves before
    #: the next queued recycle starts beside it: a boot this slow (a slow
    #: post_fork hook) must not keep a worker over --max-worker-memory, or
    #: the rest of the queue, waiting for each one in turn
    recycle_overlap = 5.0
    #: least seconds between the starts of two recycles: at most 10 a
    #: second, about a tenth of a CPU at ~10 ms each (docs/reloads.md)
    recycle_interval = 0.1

    def __init__(self, target, *, timeout, graceful_timeout, abort_first=False,
                 stop_state=None):
        self.target = target
        self.timeout = timeout                    # --timeout; 0: never
        self.graceful_timeout = graceful_timeout
        #: a worker_abort hook is installed: a stuck worker gets SIGABRT (its
        #: handler runs the hook, then exits) and SIGKILL a second later
        self.abort_first = abort_first
        self.workers = {}          # pid -> WorkerRecord
        self.boot_failures = 0     # WORKER_BOOT_ERROR exits in a row
        self.early_exits = 0       # exits before ready in a row, whatever the cause
        self.next_spawn_at = 0.0
        #: the process's one stop state (forkserve.process.stop_state): the
        #: master shares its hand-over's with this
        self.stop_state = StopState() if stop_state is None else stop_state
        self.stop_deadline = None
        self.announced = False
        self.last_recycle_at = None  # when the latest recycle started

    @property
    def stopping(self):
        """What the workers were told: None, "graceful" or "fast"."""
        return self.stop_state.workers_told

    # --- events ---

    def forked(self, index, pid, generation, number=None):
        self.workers[pid] = WorkerRecord(index, pid, generation, number)

    def fork_failed(self, now, reason):
        """fork() failed for lack of memory or processes: try again after the
        longest backoff, and say so (the server keeps serving meanwhile)."""
        self.next_spawn_at = now + self.max_backoff
        return [Log(logging.ERROR, f"could not fork a worker ({reason}); trying again in "
                                   f"{self.max_backoff:g}s")]

    def free_number(self):
        """The lowest worker number no booting or ready worker holds: a retiring
        worker's number goes to its replacement."""
        taken = {r.number for r in self.workers.values() if r.counts_towards_target}
        number = 1
        while number in taken:
            number += 1
        return number

    def observed(self, pid, now, *, beat, said_ready=False, asked_retire=False):
        """Worker `pid`'s scoreboard slot, read on a turn: when it last beat,
        whether it said it serves, whether it asked to be recycled."""
        record = self.workers[pid]
        if said_ready:
            self._ready(record)
        if asked_retire:
            self._ask(record, now)  # --max-requests, or its own memory check
        if record.deadline is not None and now > record.deadline:
            record.deadline = None
            return [Log(logging.WARNING, f"{record} did not finish within the graceful "
                                         "timeout; killing it"), Kill(pid, signal.SIGKILL)]
        if self.timeout and record.state != "stopping" and now - beat > self.timeout:
            record.state = "stopping"  # reaped on a later turn, then replaced
            out = [Log(logging.ERROR, f"{record} timed out: its event loop was blocked for "
                                      f"more than {self.timeout:g}s; killing it")]
            if self.abort_first:
                record.deadline = now + 1.0
                return out + [Kill(pid, signal.SIGABRT)]
            return out + [Kill(pid, signal.SIGKILL)]
        return []

    def exited(self, pid, outcome, now, *, said_ready=False, error=""):
        """Worker `pid` was reaped: `outcome` is its exits.Exit, `said_ready`
        whether its slot said it served, `error` what it left if it failed to
        boot. None if `pid` is not a worker (the application's child)."""
        record = self.workers.pop(pid, None)
        if record is None:
            return None
        if said_ready:
            self._ready(record)
        if record.expected_exit or self.stopping:
            return [Log(logging.INFO, f"{record} {outcome.description}")]
        if record.ready:
            return [Log(logging.ERROR, f"{record} {outcome.description}; "
                                       "starting a replacement")]
        self.early_exits += 1
        # The exponent stops growing once the delay is at its cap: a worker
        # killed as it starts, for hours, must not overflow the float.
        delay = min(self.max_backoff,
                    self.boot_backoff * 2 ** min(self.early_exits - 1, _MAX_DOUBLINGS))
        self.next_spawn_at = now + delay
        if outcome.kind != "boot_error":
            return [Log(logging.ERROR, f"{record} {outcome.description} before it was ready; "
                                       f"starting a replacement in {delay:g}s")]
        self.boot_failures += 1
        out = [Log(logging.ERROR, f"{record} failed to boot ({self.boot_failures} in a row)"
                                  + (f": {error}" if error else ""))]
        if self.boot_failures >= self.max_boot_failures:
            reason = (f"the last one's error: {error}" if error
                      else "the worker's error is logged above")
            out.append(Halt(f"workers failed to boot {self.boot_failures} times in a row; "
                            f"{reason}"))
        return out

    def tick(self, now, *, replace=True):
        """Reach the target, retire what was replaced, enforce the stop
        deadline. Not `replace`: the workers drain for a new generation."""
        if self.stopping:
            if now > self.stop_deadline:
                return [Kill(record.pid, signal.SIGKILL) for record in self.workers.values()]
            return []
        if not replace:
            return []
        out = self._next_recycle(now)
        serving = [r for r in self.workers.values() if r.counts_towards_target]
        missing = self.target - len(serving)
        if missing > 0 and now >= self.next_spawn_at:
            out += [Fork()] * missing
        if missing < 0:
            for record in sorted(serving, key=lambda r: r.number, reverse=True)[:-missing]:
                out += self._stop(record, now)
        ready = sum(1 for r in serving if r.ready)
        # A retiring worker still serves: it leaves (drains its open
        # connections) once `target` workers serve without it, the
        # longest retiring first.
        retiring = sorted((r for r in self.workers.values() if r.state == "retiring"),
                          key=lambda r: r.retiring_since)
        if ready + len(retiring) >= self.target and not self.announced:
            self.announced = True
            out.append(Announce())
        for record in retiring[:max(0, ready + len(retiring) - self.target)]:
            out.append(Log(logging.INFO, f"{record} is replaced; it drains and leaves"))
            out += self._stop(record, now)
        return out

    def stop(self, mode, now):
        """TERM ("graceful", within the graceful timeout) or QUIT ("fast",
        within a second) to every worker; None if a stop as strong, or a
        halt, is under way."""
        if self.stop_state.halting or not self.stop_state.ask(mode):
            return None
        return self.stop_workers(now)

    def stop_workers(self, now):
        """Tell every worker the stop under way (`stop_state.mode`, taken by
        whoever asked: stop() here, or the master's hand-over)."""
        if self.stop_state.mode == "graceful":
            self.stop_deadline = now + self.graceful_timeout
            return self.signal_all(signal.SIGTERM)
        self.stop_deadline = now + 1.0
        return self.signal_all(signal.SIGQUIT)

    def halt(self):
        """The server halts: SIGKILL to every worker, whose exits are expected."""
        self.stop_state.halting = True
        return self.signal_all(signal.SIGKILL)

    def retire(self, pid, now):
        """Replace worker `pid` (--max-worker-memory), then stop it: queued."""
        self._ask(self.workers[pid], now)

    def retire_all(self, now):
        """HUP under a supervisor: replace every worker, one after the other."""
        for record in sorted(self.workers.values(), key=lambda r: r.number):
            self._ask(record, now)

    def next_recycle_at(self):
        """When the next queued recycle may start (the master wakes then),
        or None if none is queued."""
        if not any(r.asked_at is not None and r.state in ("booting", "ready")
                   for r in self.workers.values()):
            return None
        if self.last_recycle_at is None:
            return 0.0
        return self.last_recycle_at + self.recycle_interval

    def asked(self, pid):
        """Worker `pid` is queued or being replaced: no need to find it over again."""
        return self.workers[pid].asked_at is not None

    def drain(self, now):
        """A new generation serves: every worker drains, each with its own
        SIGKILL deadline (tick() with replace=False replaces none)."""
        out = []
        for record in list(self.workers.values()):
            out += self._stop(record, now)
        return out

    def kill_draining(self, generation):
        """SIGKILL to the workers still draining (the hand-over's time is up)."""
        out = []
        for record in self.workers.values():
            if record.deadline is not None:
                record.deadline = None
                out += [Log(logging.WARNING, f"Sending SIGKILL to worker {record.worker_id} "
                                             f"(pid {record.pid}) of generation {generation}"),
                        Kill(record.pid, signal.SIGKILL)]
        return out

    def signal_all(self, signum):
        out = []
        for record in self.workers.values():
            record.expected_exit = True
            record.state = "stopping"
            out.append(Kill(record.pid, signum))
        return out

    # --- inside ---

    def _ask(self, record, now):
        if record.asked_at is None and record.state in ("booting", "ready"):
            record.asked_at = now

    def _next_recycle(self, now):
        """Start the first queued recycle, if none is under way (or the one
        under way has waited `recycle_overlap` for its replacement) and the
        last one started `recycle_interval` ago."""
        queued = [r for r in self.workers.values()
                  if r.asked_at is not None and r.state in ("booting", "ready")]
        if not queued or now < self.next_recycle_at():
            return []
        since = [r.retiring_since for r in self.workers.values() if r.state == "retiring"]
        if since and now - max(since) < self.recycle_overlap:
            return []
        record = min(queued, key=lambda r: (r.asked_at, r.number))
        record.state, record.retiring_since = "retiring", now
        self.last_recycle_at = now
        waiting = len(queued) - 1
        return [Log(logging.INFO, f"{record} is recycled: forking its replacement"
                                  + (f" ({waiting} more waiting their turn)" if waiting else "")
                                  + (f"; the last replacement has not said it serves within "
                                     f"{self.recycle_overlap:g}s" if since else ""))]

    def _ready(self, record):
        if record.ready:
            return
        record.ready = True
        self.boot_failures = self.early_exits = 0
        if record.state == "booting":
            record.state = "ready"

    def _stop(self, record, now):
        record.state = "stopping"
        record.expected_exit = True
        record.deadline = now + self.graceful_timeout + 1.0
        return [Kill(record.pid, signal.SIGTERM)]
