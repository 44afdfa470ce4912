"""The loop every server process runs, and the decisions' actions carried out.

The master (-w N), the single-process server (-w 0) and the supervisor are
each a Driver. They differ in what they reap (workers and generations, or
generations only), what they decide on a turn (the workers' lifecycle, the
memory log, the hand-over's clock) and how they wait (the master and the
supervisor select() on the original syscalls; the single server waits on
its gevent hub, which serves the requests meanwhile). The order of a turn is
the same for all three, and written once here:

    dispatch signals -> parent gone? -> reap -> finished? -> decide -> wait

Invariants:
- Signals are dispatched first, so a stop or a reload asked for before the
  turn began is seen by every step after it; a handler only enqueues, the
  turn calls `handle_<name>()`.
- Reaping comes before the "finished?" check: a process stops once its last
  child has been collected, never with a child it has not waited for.
- One stop state per process (forkserve.process.stop_state), the driver's
  `stop_state`, handed to its hand-over (and the master's lifecycle): None
  until a stop, then the mode of the strongest one asked for. Stopping,
  draining and halting are read from it and from the hand-over, never kept
  beside them. A stop is begun in one place, `begin_stop`.
- The decisions themselves are pure (forkserve.process.handover and
  forkserve.process.lifecycle); a driver only reads the world for them and
  carries out what they return (`apply`, the one place that does, for
  every action of forkserve.process.actions).
"""

import errno
import logging
import os
import signal

from forkserve import exits
from forkserve.process import generation_protocol, systemd
from forkserve.process.actions import (Announce, BecomeSupervisor, ForceOut, Fork, Forward, Halt,
                                       Kill, Log, Notify, Retire, Spawn, Stop)
from forkserve.process.signals import handler_name

__all__ = ["Driver"]

log = logging.getLogger("forkserve.error")

#: what fork() raises when the system is out of processes or memory
FORK_ERRNOS = {errno.EAGAIN, errno.ENOMEM}


class Driver:
    """The loop, and the actions of forkserve.process.actions carried out.

    A driver has `self.stop_state`, `self.handover` (holding the same stop
    state), `self.clock()`, `self.hooks` (a
    forkserve.process.hooks.Hooks), `self.generations` (a
    forkserve.process.generations.Generations) and `self.queue` (whose
    `pop_all()` gives the signals received since the last turn), and
    provides the steps of a turn:

    - `begin()`: what comes before the first turn (a HaltServer it raises
      halts, as one from a turn does);
    - `reap()`: collect the children that exited;
    - `decide()`: everything else a turn does (the clock, the workers);
    - `finished()`: True once stopped with nothing left to wait for;
    - `wait()`: sleep until a signal, a ready generation or the next deadline;
    - `stop_own(mode, now)`: what else a stop does in this process (the
      master stops its workers), after the hand-over stopped the others;

    and what the actions ask: `retire(number)`; the master also
    `spawn_worker()` (a pid, or None when it could not fork), `kill(pid,
    signum)`, `kill_own_workers()` and `resize_own(signum)` (TTIN/TTOU for
    its own workers); the master and the single server also `role` (for
    Announce) and `become_supervisor(action)`.
    """

    #: a generation's supervisor (its pid): once it is gone (SIGKILL), this
    #: generation stops; None when this process is not a supervised generation
    parent = None

    # --- the loop ---

    def serve(self) -> int:
        """begin(), then turn until finished: exits.OK; or, halted (a
        HaltServer: no generation or no worker could start, a hook raised),
        halt() and the HaltServer's status."""
        try:
            self.begin()
            self.loop()
        except exits.HaltServer as halt:
            log.error("Shutting down: %s", halt.reason)
            self.halt()
            return halt.status
        log.info("Shutting down: master")
        return exits.OK

    def halt(self):
        """Giving up: every generation this process started stops fast."""
        for number in list(self.generations.pids):
            self.generations.signal(number, signal.SIGQUIT)

    def loop(self):
        """Turn until finished."""
        while self.turn():
            self.wait()

    def turn(self) -> bool:
        """One turn of the loop, but the wait; False once finished."""
        self.dispatch_signals()
        if self.supervisor_gone():
            self.begin_stop("graceful")
        self.reap()
        if self.finished():
            return False
        self.decide()
        return True

    def dispatch_signals(self):
        for signum in self.queue.pop_all():
            getattr(self, handler_name(signum))()

    # --- the signals every driver handles alike (forkserve.process.signals) ---

    def handle_term(self):
        self.begin_stop("graceful")

    def handle_int(self):
        self.begin_stop("fast")

    def handle_quit(self):
        self.begin_stop("fast")

    def handle_chld(self):
        pass  # reap() runs on every turn

    def handle_ttin(self):
        self.apply(self.handover.resize(1, self.clock()))

    def handle_ttou(self):
        self.apply(self.handover.resize(-1, self.clock()))

    def wait_timeout(self, timeout):
        """`timeout`, or less when a TTIN/TTOU is due for forwarding sooner."""
        due = self.handover.forward_wait(self.clock())
        return timeout if due is None else min(timeout, due)

    def begin_stop(self, mode):
        """A TERM ("graceful"), an INT or QUIT ("fast") or the parent gone:
        nothing if a stop as strong is under way (or the process handed
        over); else the hand-over takes `mode` into the stop state and stops
        the other generations, and `stop_own` does the rest."""
        if self.stop_state.under_way(mode):
            return
        now = self.clock()
        self.apply(self.handover.stop(mode, now))
        self.stop_own(mode, now)

    def stop_own(self, mode, now):
        """What a stop does in this process besides the hand-over's: nothing
        here (the single server drains once its loop ends)."""

    @property
    def stopping(self):
        """None, the stop under way ("graceful" or "fast"), or DONE once
        handed over (forkserve.process.stop_state)."""
        return self.stop_state.stopping

    def supervisor_gone(self) -> bool:
        """True, once and logged, when this generation's supervisor has died."""
        if self.parent is None or os.getppid() == self.parent:
            return False
        log.warning("The supervisor (pid %d) is gone; stopping", self.parent)
        self.parent = None
        return True

    # --- the generations: their ready bytes, exits and the clock to the hand-over ---

    def follow_generations(self):
        """The starting generations' ready bytes and the clock, to the hand-over."""
        now = self.clock()
        for _ in self.generations.newly_ready():
            self.apply(self.handover.ready(now))
        self.apply(self.handover.tick(now))

    def generation_exited(self, pid, description):
        """A reaped child: if it was a generation, the hand-over hears of it
        (True); False for any other child."""
        number = self.generations.exited(pid)
        if number is None:
            return False
        self.apply(self.handover.gone(number, f"(pid {pid}) {description}", self.clock()))
        return True

    # --- the decisions' actions, carried out ---

    def apply(self, actions):
        """Carry out, in order, what forkserve.process.lifecycle or
        forkserve.process.handover decided. A Fork that fails (no free slot,
        fork() refused) skips the Forks after it: the lifecycle asks again
        on a later turn. Halt raises exits.HaltServer."""
        forking = True
        for action in actions:
            if type(action) is Fork:
                forking = forking and self.spawn_worker() is not None
            else:
                getattr(self, _ACTIONS[type(action)])(action)

    def _do_kill(self, action):
        self.kill(action.pid, action.signum)

    def _do_announce(self, action):
        generation_protocol.signal_ready(self.role)  # to the supervisor, if this is a generation
        systemd.notify("READY=1")

    def _do_spawn(self, action):
        self.hooks.on_reload()   # Gunicorn's reload hooks, where a config installed them
        self.hooks.pre_exec()
        try:
            self.generations.spawn(action.number)
        except OSError as exc:
            if exc.errno not in FORK_ERRNOS:
                raise
            # a failed start, as if it had died loading: the serving one goes on
            self.apply(self.handover.gone(
                action.number, f"could not be started (fork: {exc.strerror}; free "
                               "memory or raise the process limit)", self.clock()))

    def _do_retire(self, action):
        self.retire(action.number)

    def _do_force_out(self, action):
        if action.number == self.handover.owner:
            self.kill_own_workers()  # the master's own generation: its workers
        else:
            self.generations.force_out(action.number, action.hard)

    def _do_stop(self, action):
        self.generations.signal(action.number,
                                signal.SIGTERM if action.mode == "graceful" else signal.SIGQUIT)

    def _do_forward(self, action):
        if action.number == self.handover.owner:
            self.resize_own(action.signum)  # the master's own workers
        else:
            self.generations.signal(action.number, action.signum)

    def _do_notify(self, action):
        systemd.notify(action.state)

    def _do_log(self, action):
        log.log(action.level, "%s", action.message)

    def _do_become_supervisor(self, action):
        self.become_supervisor(action)

    def _do_halt(self, action):
        raise exits.HaltServer(action.reason, action.status)


_ACTIONS = {Kill: "_do_kill", Announce: "_do_announce", Spawn: "_do_spawn",
            Retire: "_do_retire", Stop: "_do_stop", ForceOut: "_do_force_out",
            Forward: "_do_forward", BecomeSupervisor: "_do_become_supervisor",
            Notify: "_do_notify", Log: "_do_log", Halt: "_do_halt"}
