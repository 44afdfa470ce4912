"""The master: spawn, reap, murder and manage workers.

The master has already loaded the application and hardened its memory
(cow.harden) when it gets here; every worker is a fork of it. Its loop does
no application work and allocates little, so the pages it shares with the
workers stay clean:

    dispatch signals -> reap -> murder (timeouts, memory) -> manage -> sleep

Signal handlers only enqueue (forkserve.process.signals); `handle_<name>()`
methods run from the loop. The master waits with the original select(),
fork() and waitpid() even when gevent has monkey-patched them for the
application: the master never runs a gevent hub.

Recycling (--max-requests, --max-worker-memory) is always "replacement
first": the worker is marked retiring, which stops it counting towards the
target, so `manage()` forks a replacement; once enough workers are ready,
the retiring one gets TERM and drains its in-flight requests.

A reload (HUP) is decided by forkserve.process.handover, shared with the
single-process server and the supervisor; the master only carries out its
actions (reload.Driver): spawn the generation, drain its own workers once it
serves, exec into the supervisor once they are gone.
"""

import logging
import os
import random
import signal
import time

from forkserve import exits
from forkserve.exits import HaltServer
from forkserve.memory import why
from forkserve.process import autoreload, hooks, procname, reload, signals, systemd
from forkserve.process.generations import Driver, Generations, reaped
from forkserve.process.handover import Handover
from forkserve.process.master_memory import WorkerMemory
from forkserve.process.master_reload import MasterReload
from forkserve.process.workers import WorkerRecord, free_number
from forkserve.process.scoreboard import FREE, READY, RETIRE, Scoreboard, heartbeat_interval
from forkserve.process.signals import MASTER_SIGNALS, SignalQueue, handler_name
from forkserve.process.unpatched import original
from forkserve.process.worker import Worker

__all__ = ["Master"]

log = logging.getLogger("forkserve.error")


class Master(Driver, MasterReload, WorkerMemory):
    #: consecutive boot failures after which the master gives up
    max_boot_failures = 5
    #: first backoff delay after a boot failure; doubles each time
    boot_backoff = 0.1

    def __init__(self, cfg, app, listeners, app_name, role=reload.Role(), *, stats=None,
                 fork=None, waitpid=None, kill=os.kill, select=None, clock=time.monotonic):
        self.cfg = cfg
        self.app = app
        self.listeners = listeners
        self.app_name = app_name
        self.stats = stats
        self.target = cfg.workers
        self.workers = {}
        self.scoreboard = Scoreboard()
        self.queue = SignalQueue()
        self.role = role
        self.generation = role.generation
        self.boot_failures = 0
        self.next_spawn_at = 0.0
        self.stopping = None
        self.halting = False  # a HaltServer is being carried out
        self.stop_deadline = None
        #: HUP reloads code and data in a new generation, unless this master
        #: is itself a generation under a supervisor (then HUP restarts workers)
        self.reloadable = not role.supervised
        #: a generation's supervisor: when it is gone (SIGKILL), this generation stops
        self.parent = os.getppid() if role.supervised else None
        self.announced = False
        self.next_memory_check = 0.0
        self.next_memory_log = 0.0
        self._fork = fork or original("os", "fork")
        self._waitpid = waitpid or original("os", "waitpid")
        self._kill = kill
        self._select = select or original("select", "select")
        self.clock = clock
        self.handover = Handover(serving=self.generation, owner_serves=True,
                                 graceful_timeout=cfg.graceful_timeout)
        self.generations = Generations(listeners, fork=self._fork, kill=kill)
        self.why = None  # the --why listener, opened by run()

    # --- the loop ---

    def run(self) -> int:
        role = "master" if self.reloadable else f"generation {self.generation}"
        procname.set_title(self.cfg, role, self.app_name)
        self.queue.install(MASTER_SIGNALS, setter=original("signal", "signal"))
        self.why = why.listen(self.app_name, fork=self._fork)  # forkserve memory --why
        signals.release()
        log.info("Using master pid %d with %d workers", os.getpid(), self.target)
        try:
            hooks.when_ready(self)
            while self.turn():
                self.sleep()
        except HaltServer as halt:
            log.error("Shutting down: %s", halt.reason)
            self.halting = True  # a hook raising while the rest are reaped halts nothing more
            self.stop_all(signal.SIGKILL)
            for number in list(self.generations.pids):  # a reload under way stops too
                self.generations.signal(number, signal.SIGQUIT)
            self.wait_all(deadline=self.clock() + 5)
            return halt.status
        log.info("Shutting down: master")
        return exits.OK

    def turn(self) -> bool:
        """One turn of the loop, but the sleep; False once stopped with no child left."""
        self.dispatch_signals()
        self.check_parent()
        self.reap()
        if self.stopping and not self.workers and not self.generations.pids:
            return False
        self.murder()
        self.check_reload()
        self.manage()
        self.log_memory()
        autoreload.poll()
        return True

    def check_parent(self):
        if self.parent is not None and not self.stopping and os.getppid() != self.parent:
            log.warning("The supervisor (pid %d) is gone; stopping", self.parent)
            self.begin_stop("graceful")

    def dispatch_signals(self):
        for signum in self.queue.pop_all():
            getattr(self, handler_name(signum))()

    def sleep(self):
        timeout = heartbeat_interval(self.cfg.timeout)
        now = self.clock()
        if self.next_spawn_at > now:
            timeout = min(timeout, self.next_spawn_at - now)
        watched = [self.queue.wake_r, *self.generations.waiting_fds()]
        watched += self.stats.filenos() if self.stats else []
        watched += self.why.filenos() if self.why else []
        try:
            readable, writable, _ = self._select(
                watched, self.stats.writable_filenos() if self.stats else [], [],
                max(0.0, timeout))
        except InterruptedError:
            return
        if self.queue.wake_r in readable:
            self.queue.drain_wakeups()
        if self.why:
            self.why.service(readable)
        if self.stats:
            self.stats.service(readable, writable, self.report, self.serving)

    # --- signal handlers (called from the loop, never from a signal) ---

    def handle_chld(self):
        pass  # reap() runs on every turn of the loop

    def handle_term(self):
        self.begin_stop("graceful")

    def handle_int(self):
        self.begin_stop("fast")

    handle_quit = handle_int

    def handle_hup(self):
        if self.reloadable:
            self.apply(self.handover.hup(self.clock()))
        elif not self.stopping:
            self.restart_workers()

    handle_usr2 = handle_hup

    def restart_workers(self):
        log.info("Hang up: restarting %d workers gracefully", self.target)
        for record in self.workers.values():
            if record.state in ("booting", "ready"):
                record.state = "retiring"

    def handle_ttin(self):
        if self.target >= self.scoreboard.capacity // 2:
            log.warning("TTIN ignored: already at %d workers", self.target)
            return
        self.target += 1
        log.info("TTIN: %d workers", self.target)
        hooks.nworkers_changed(self.target, self.target - 1)

    def handle_ttou(self):
        if self.target <= 1:
            log.info("TTOU ignored: at least one worker is kept")
            return
        self.target -= 1
        log.info("TTOU: %d workers", self.target)
        hooks.nworkers_changed(self.target, self.target + 1)

    def handle_usr1(self):
        from forkserve import logs
        logs.reopen(self.cfg)
        self.signal_workers(signal.SIGUSR1)

    def begin_stop(self, mode):
        if self.stopping == "fast" or (self.stopping and mode == "graceful"):
            return
        self.stopping = mode
        self.apply(self.handover.stop(mode, self.clock()))
        systemd.notify("STOPPING=1")
        now = self.clock()
        if mode == "graceful":
            self.stop_deadline = now + self.cfg.graceful_timeout
            log.info("Handling signal: term (graceful stop, up to %gs)", self.cfg.graceful_timeout)
            self.stop_all(signal.SIGTERM)
        else:
            self.stop_deadline = now + 1.0
            log.info("Handling signal: fast stop")
            self.stop_all(signal.SIGQUIT)

    # --- reap ---

    def reap(self):
        halt = None
        for pid, status in reaped(self._waitpid):
            number = self.generations.exited(pid)
            if number is not None:
                outcome = exits.classify(status)
                self.apply(self.handover.gone(number, f"(pid {pid}) {outcome.description}",
                                              self.clock()))
                continue
            record = self.workers.pop(pid, None)
            if record is None:
                continue  # not one of ours (e.g. a process the application spawned)
            self.scoreboard.release(record.index)
            try:
                hooks.child_exit(record.index, record.pid)
            except HaltServer as raised:  # logged; every exited worker is seen to first
                halt = halt or raised
            self.on_worker_exit(record, exits.classify(status))
        if halt is not None and not self.halting:
            raise halt

    def on_worker_exit(self, record, outcome):
        if record.expected_exit or self.stopping:
            log.info("Worker %d (pid %d) %s", record.worker_id, record.pid, outcome.description)
            return
        if not record.ready:
            self.boot_failures += 1
            delay = self.boot_backoff * 2 ** (self.boot_failures - 1)
            self.next_spawn_at = self.clock() + delay
            log.error("Worker %d (pid %d) %s before it was ready (%d in a row)",
                      record.worker_id, record.pid, outcome.description, self.boot_failures)
            if self.boot_failures >= self.max_boot_failures:
                raise HaltServer(f"workers failed to boot {self.boot_failures} times in a row; "
                                 "the worker's error is logged above", exits.WORKER_BOOT_ERROR)
            return
        log.error("Worker %d (pid %d) %s; starting a replacement", record.worker_id,
                  record.pid, outcome.description)

    # --- murder: timeouts, drain deadlines, memory limits ---

    def murder(self):
        now = self.clock()
        for record in list(self.workers.values()):
            slot = self.scoreboard.read(record.index)
            if not record.ready and slot.state >= READY:  # RETIRE and STOPPING come later
                record.ready = True
                self.boot_failures = 0
                if record.state == "booting":
                    record.state = "ready"
            if slot.state == RETIRE and record.state == "ready":
                record.state = "retiring"
            if record.deadline is not None and now > record.deadline:
                log.warning("Worker %d (pid %d) did not finish within the graceful timeout; "
                            "killing it", record.worker_id, record.pid)
                self.kill(record, signal.SIGKILL)
                record.deadline = None
            elif (self.cfg.timeout and record.state != "stopping"
                  and now - slot.beat > self.cfg.timeout):
                log.error("Worker %d (pid %d) timed out: its event loop was blocked for more "
                          "than %gs; killing it", record.worker_id, record.pid,
                          self.cfg.timeout)
                if hooks.installed("worker_abort"):  # its handler runs the hook, then exits
                    record.deadline = now + 1.0       # ... or SIGKILL follows
                self.kill(record, signal.SIGABRT if record.deadline else signal.SIGKILL)
                record.state = "stopping"  # reaped on the next turn, then replaced
        if self.cfg.max_worker_memory and now >= self.next_memory_check:
            self.next_memory_check = now + self.memory_check_interval
            self.check_worker_memory()

    # --- manage: reach the target, retire what was replaced ---

    def manage(self):
        if self.stopping:
            if self.clock() > self.stop_deadline:
                self.stop_all(signal.SIGKILL)
            return
        if self.handover.retiring == self.generation:
            return  # our workers drain for the new generation: none is replaced
        serving = [r for r in self.workers.values() if r.counts_towards_target]
        missing = self.target - len(serving)
        while missing > 0 and self.clock() >= self.next_spawn_at:
            if self.spawn_worker() is None:
                break
            missing -= 1
        if missing < 0:
            for record in sorted(serving, key=lambda r: r.number, reverse=True)[:-missing]:
                self.stop_worker(record)
        ready = sum(1 for r in serving if r.ready)
        # A retiring worker (--max-requests) was ready and no longer accepts:
        # it leaves (draining its open connections) once its replacement has
        # started, even if that one recycles before it is seen ready.
        retiring = [r for r in self.workers.values() if r.state == "retiring"]
        if ready + len(retiring) >= self.target and not self.announced:
            self.announced = True
            reload.signal_ready(self.role)  # to the supervisor, if this is a generation
            systemd.notify("READY=1")
        for record in retiring[:max(0, len(serving) + len(retiring) - self.target)]:
            self.stop_worker(record)

    def serving(self):
        """GET /health on --stats: the workers were all up once and no stop is under way."""
        return self.announced and not self.stopping

    def spawn_worker(self):
        index = self.free_slot()
        if index is None:
            log.error("No free scoreboard slot for another worker")
            return None
        self.scoreboard.prepare(index)
        max_requests = self.cfg.max_requests
        if max_requests and self.cfg.max_requests_jitter:
            max_requests += random.randint(0, self.cfg.max_requests_jitter)
        number = free_number(self.workers.values())
        worker = Worker(index, self.app, self.listeners, self.cfg, self.scoreboard,
                        self.app_name, generation=self.generation, max_requests=max_requests,
                        close_fds=self.master_fds(), number=number)
        hooks.pre_fork(worker)
        # Until the worker has its own handlers, a signal sent to it (a TERM
        # right after the fork) must wait, not run the master's handler in it
        # and be lost: the worker unblocks them in init_process().
        signals.hold()
        try:
            pid = self._fork()
            if pid == 0:
                worker.start()  # never returns
        finally:
            signals.release()
        self.workers[pid] = WorkerRecord(index, pid, self.generation, number)
        return pid

    def free_slot(self):
        used = {record.index for record in self.workers.values()}
        for index in range(self.scoreboard.capacity):
            if index not in used and self.scoreboard.read(index).state == FREE:
                return index
        return None

    def master_fds(self):
        """Descriptors a worker closes: the master's own, and the reload pipes
        (a worker holding a ready pipe would hide its generation's death)."""
        fds = [self.queue.wake_r, self.queue.wake_w] + (self.why.filenos() if self.why else [])
        fds += self.generations.waiting_fds()
        if self.role.ready_fd is not None and not self.announced:  # closed once announced
            fds.append(self.role.ready_fd)
        if self.stats:
            fds.extend(self.stats.all_filenos())
        return fds

    def stop_worker(self, record, signum=signal.SIGTERM):
        record.state = "stopping"
        record.expected_exit = True
        record.deadline = self.clock() + self.cfg.graceful_timeout + 1.0
        self.kill(record, signum)

    def stop_all(self, signum):
        for record in list(self.workers.values()):
            record.expected_exit = True
            record.state = "stopping"
            self.kill(record, signum)

    def signal_workers(self, signum):
        for record in self.workers.values():
            self.kill(record, signum)

    def kill(self, record, signum):
        try:
            self._kill(record.pid, signum)
        except ProcessLookupError:
            pass  # already gone; reap() will collect it

    def wait_all(self, deadline):
        while self.workers and self.clock() < deadline:
            self.reap()
            if self.workers:
                self._select([self.queue.wake_r], [], [], 0.05)
