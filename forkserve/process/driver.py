"""The loop every forkserve process runs, and the decisions' actions carried out.

Every process is a `Loop`: the master (-w N), the single-process server
(-w 0) and the supervisor are each a `Driver` (a Loop that also carries out
the hand-over's actions), and a worker is a plain Loop. They differ in what
they reap (workers and generations, generations only, or nothing), what
they decide on a turn (the workers' lifecycle, the memory log, the
hand-over's clock; a worker's heartbeat and title) and how they wait (the
master and the supervisor select() on the original syscalls; the single
server and a worker select() through gevent, whose hub serves the requests
meanwhile). The order of a turn is the same for all, and written once here:

    dispatch signals -> parent gone? -> reap -> finished? -> decide -> wait

and so are the loops around it: `drain` (a stopping worker's, the single
server's: in-flight requests finish while signals are still dispatched),
and `reap_until` (the last children collected after the loop).

Invariants:
- Signals are dispatched first, so a stop or a reload asked for before the
  turn began is seen by every step after it; a handler only enqueues, the
  turn calls `handle_<name>()`.
- Reaping comes before the "finished?" check: a process stops once its last
  child has been collected, never with a child it has not waited for.
- One stop state per process (forkserve.process.stop_state), the loop's
  `stop_state`, handed to its hand-over (and the master's lifecycle): None
  until a stop, then the mode of the strongest one asked for. Stopping,
  draining and halting are read from it and from the hand-over, never kept
  beside them. A stop is begun in one place, `begin_stop`.
- The decisions themselves are pure (forkserve.process.handover and
  forkserve.process.lifecycle); a driver only reads the world for them and
  carries out what they return (`apply`, the one place that does, for
  every action of forkserve.process.actions).
- What the master, the single server and the supervisor share beyond the
  loop is here too, each supplying only what differs: reaping
  (`exited_children`, `worker_exited`), the stats endpoint and --why served
  from the wait, the memory report (`process_infos`) and its log.
"""

import errno
import logging
import math
import os
import signal

from forkserve import exits
from forkserve.memory import model, render
from forkserve.process import generation_protocol, systemd
from forkserve.process.actions import (Announce, BecomeSupervisor, ForceOut, Fork, Forward, Halt,
                                       Kill, Log, Notify, Retire, Spawn, Stop)
from forkserve.process.generations import reaped
from forkserve.process.signals import handler_name

__all__ = ["Loop", "Driver"]

log = logging.getLogger("forkserve.error")

#: what fork() raises when the system is out of processes or memory
FORK_ERRNOS = {errno.EAGAIN, errno.ENOMEM}
#: seconds between two looks for the last children (`reap_until`): SIGCHLD
#: is not waited on then
REAP_POLL = 0.05


class Loop:
    """The loop of every forkserve process.

    A loop has `self.stop_state` (forkserve.process.stop_state), `self.cfg`,
    `self.clock()`, `self.queue` (a forkserve.process.signals.SignalQueue)
    and `self._select` (select.select, or gevent's where a hub serves), and
    provides the steps of a turn:

    - `reap()`: collect the children that exited (none: nothing to do);
    - `finished()`: True once stopped with nothing left to wait for;
    - `decide()`: everything else a turn does;
    - `next_turn_in()`: the longest wait before the next turn;
    - `stop_own(mode, now)`: what a stop does in this process, if anything.
    """

    #: the process this one stops without (its master, its supervisor): its
    #: pid, None when there is none to watch
    parent = None

    # --- the loop ---

    def loop(self):
        """Turn until finished."""
        while self.turn():
            self.wait()

    def turn(self) -> bool:
        """One turn of the loop, but the wait; False once finished."""
        self.dispatch_signals()
        if self.parent_gone():
            self.begin_stop("graceful")
        self.reap()
        if self.finished():
            return False
        self.decide()
        return True

    def dispatch_signals(self):
        for signum in self.queue.pop_all():
            getattr(self, handler_name(signum))()

    def reap(self):
        """A process without children has none to collect."""

    # --- stopping (forkserve.process.stop_state) ---

    def handle_term(self):
        self.begin_stop("graceful")

    def handle_int(self):
        self.begin_stop("fast")

    def handle_quit(self):
        self.begin_stop("fast")

    def begin_stop(self, mode):
        """A TERM ("graceful"), an INT or QUIT ("fast") or the parent gone:
        nothing if a stop as strong is under way; else `stop_own`."""
        if self.stop_state.ask(mode):
            self.stop_own(mode, self.clock())

    def stop_own(self, mode, now):
        """What a stop does in this process besides taking `mode`: nothing
        here (a worker and the single server drain once their loop ends)."""

    @property
    def stopping(self):
        """None, the stop under way ("graceful" or "fast"), or DONE once
        handed over (forkserve.process.stop_state)."""
        return self.stop_state.stopping

    def parent_gone(self) -> bool:
        """True, once and logged, when the parent this process watches has died."""
        if self.parent is None or os.getppid() == self.parent:
            return False
        self.log_parent_gone()
        self.parent = None
        return True

    def log_parent_gone(self):
        log.warning("The supervisor (pid %d) is gone; stopping", self.parent)

    # --- waiting ---

    def wait(self):
        """Sleep until a signal, a watched descriptor (`watched()`, then
        `service()`) or the next turn is due."""
        readable_fds, writable_fds = self.watched()
        try:
            readable, writable, _ = self._select(
                [self.queue.wake_r, *readable_fds], writable_fds, [],
                max(0.0, self.wait_timeout(self.next_turn_in())))
        except InterruptedError:
            return
        if self.queue.wake_r in readable:
            self.queue.drain_wakeups()
        self.service(readable, writable)

    def pause(self, timeout):
        """Sleep until a signal or `timeout` seconds pass, watching nothing else."""
        try:
            readable, _, _ = self._select([self.queue.wake_r], [], [], timeout)
        except InterruptedError:
            return
        if readable:
            self.queue.drain_wakeups()

    def watched(self):
        """The descriptors `wait()` watches besides the signals: (readable, writable)."""
        return [], []

    def service(self, readable, writable):
        """Serve what `wait()` found ready among `watched()`."""

    def wait_timeout(self, timeout):
        return timeout

    # --- after the loop ---

    def drain(self, servers):
        """Let in-flight requests finish (each server up to
        --graceful-timeout), still turning on signals: a HUP during a
        hand-over's drain is remembered by the hand-over, a USR1 reopens the
        logs, a TERM answers /health 503; `while_draining()` each time."""
        import gevent

        drains = [gevent.spawn(server.drain, self.cfg.graceful_timeout) for server in servers]
        for drain in drains:
            drain.link(lambda _: self.queue.wake())
        while not all(drain.dead for drain in drains):
            self.while_draining()
            self.wait()  # a signal, a drain that ended, or the next turn
            self.dispatch_signals()

    def while_draining(self):
        """What a turn of the drain does besides the signals (a worker beats)."""


class Driver(Loop):
    """The loop of a server process, and the actions of
    forkserve.process.actions carried out.

    A driver has, besides a Loop's, `self.handover` (holding the loop's stop
    state), `self.hooks` (a forkserve.process.hooks.Hooks), `self.generations`
    (a forkserve.process.generations.Generations), `self.stats` (a
    forkserve.http.stats.StatsEndpoint, or None) and `self.role`, and
    provides:

    - `begin()`: what comes before the first turn (a HaltServer it raises
      halts, as one from a turn does);
    - `serving()`: whether it serves now (GET /health);
    - `process_infos()`: its processes, for the memory report;

    and what the actions ask: `retire(number)`; the master also
    `spawn_worker()` (a pid, or None when it could not fork), `kill(pid,
    signum)`, `kill_own_workers()` and `resize_own(signum)` (TTIN/TTOU for
    its own workers), and `worker_exited(pid, outcome)` for the children
    that are not generations.
    """

    #: the --why listener (forkserve.memory.copied_objects), the master's
    why = None
    stats = None
    #: when the memory log (--memory-log-interval) is next due
    next_memory_log = 0.0

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

    @property
    def draining(self):
        """The hand-over retired this process's own generation (the master's,
        the single server's): a new one serves, this one drains, then hands
        over. The single server's loop ends; the master's workers leave and
        are not replaced."""
        owner = self.handover.owner
        return owner is not None and self.handover.retiring == owner

    def begin_stop(self, mode):
        """As Loop.begin_stop, the hand-over taking `mode` into the stop state
        and stopping the other generations before `stop_own`."""
        if self.stop_state.under_way(mode):
            return
        now = self.clock()
        self.apply(self.handover.stop(mode, now))
        self.stop_own(mode, now)

    # --- the signals every driver handles alike (forkserve.process.signals) ---

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

    # --- what the wait watches: the generations' ready pipes, --stats, --why ---

    def watched(self):
        readable = self.generations.waiting_fds()
        readable += self.stats.filenos() if self.stats else []
        readable += self.why.filenos() if self.why else []
        return readable, self.stats.writable_filenos() if self.stats else []

    def service(self, readable, writable):
        if self.why:
            self.why.service(readable)
        if self.stats:
            self.stats.service(readable, writable, self.fresh_report, self.serving)

    # --- reaping ---

    def reap(self):
        """Collect the children that exited: a generation's exit goes to the
        hand-over, any other child's to `worker_exited`. A HaltServer that
        raises waits until every exited child is seen to (unless halting)."""
        halt = None
        for pid, outcome in self.exited_children():
            if self.generation_exited(pid, outcome.description):
                continue
            try:
                self.worker_exited(pid, outcome)
            except exits.HaltServer as raised:
                halt = halt or raised
        if halt is not None and not self.stop_state.halting:
            raise halt

    def exited_children(self):
        """(pid, exits.Exit) of each child that exited, without blocking."""
        for pid, status in reaped(self._waitpid):
            yield pid, exits.classify(status)

    def worker_exited(self, pid, outcome):
        """A child that is not a generation exited: not one of ours (the
        supervisor's: a worker of the master it used to be)."""

    def reap_until(self, done, deadline=math.inf):
        """Reap until `done()` or the deadline, looking every REAP_POLL
        seconds; while stopping, the hand-over's clock forces out the
        generations that stay."""
        while not done() and self.clock() < deadline:
            self.reap()
            if self.stopping:
                self.apply(self.handover.tick(self.clock()))
            if not done():
                self.pause(REAP_POLL)

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

    def become_supervisor(self, action):
        """The hand-over is done (the master's or the single server's): exec
        into the supervisor, with the listeners, the stats endpoint's
        listener and history, and the signals not dispatched yet."""
        stats = self.stats
        generation_protocol.exec_supervisor(
            self.cfg, self.app_name, self.generations.pid(action.number), action.number,
            self.listeners, stats.listener if stats else None,
            reload_again=action.reload_again, queue=self.queue, workers=action.workers,
            history=stats.history if stats else None)

    # --- the memory report: GET /json and /metrics on --stats, --memory-log-interval ---

    def report(self):
        """The memory report, the latest sample's when the stats endpoint
        keeps a history (a fresh one when that is due): a report makes the
        kernel walk every process's pages, so it is read at the history's
        pace, however often it is scraped or logged."""
        if self.stats:
            return self.stats.latest_report(self.fresh_report)
        return self.fresh_report()

    def fresh_report(self):
        """The memory report, read now: this process's own processes
        (`process_infos()`), or, once a reload started a generation under a
        master or single server, the whole tree under this process."""
        if self.handover.owner is not None and self.generations.pids:
            return model.collect(model.discover(os.getpid()))
        return model.collect(self.process_infos())

    def log_memory(self):
        """The memory report in the log, every --memory-log-interval seconds."""
        interval = self.cfg.memory_log_interval
        now = self.clock()
        if not interval or now < self.next_memory_log:
            return
        self.next_memory_log = now + interval
        render.log_report(log, self.report())

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
