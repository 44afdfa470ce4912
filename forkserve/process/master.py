"""The master: spawn, reap, murder and manage workers.

The master has already loaded the application and hardened its memory
(cow.harden) when it gets here; every worker is a fork of it. Its loop does
no application work and allocates little, so the pages it shares with the
workers stay clean:

    dispatch signals -> reap -> murder (timeouts, memory) -> manage -> sleep

Signal handlers only enqueue (forkserve.process.signals); `handle_<name>()` methods
run from the loop. The master waits with the original select(), fork() and
waitpid() even when gevent has monkey-patched them for the application: the
master never runs a gevent hub.

Recycling (--max-requests, --max-worker-memory, HUP) is always "replacement
first": the worker is marked retiring, which stops it counting towards the
target, so `manage()` forks a replacement; once enough workers are ready,
the retiring one gets TERM and drains its in-flight requests.
"""

import logging
import os
import random
import signal
import time

from forkserve import exits
from forkserve.memory import reporter
from forkserve.process import autoreload, hooks, procname, reload, signals, systemd
from forkserve.exits import HaltServer
from forkserve.process.scoreboard import FREE, READY, RETIRE, Scoreboard
from forkserve.process.signals import MASTER_SIGNALS, SignalQueue, handler_name
from forkserve.process.worker import Worker, heartbeat_interval

__all__ = ["Master", "WorkerRecord"]

log = logging.getLogger("forkserve.error")


def _original(module, name):
    """The unpatched function even if gevent monkey-patched the module."""
    try:
        from gevent import monkey
    except ImportError:
        return getattr(__import__(module), name)
    return monkey.get_original(module, name)


class WorkerRecord:
    __slots__ = ("index", "pid", "state", "spawned", "ready", "deadline", "expected_exit",
                 "generation")

    def __init__(self, index, pid, generation, now):
        self.index = index
        self.pid = pid
        self.state = "booting"     # booting, ready, retiring, stopping
        self.spawned = now
        self.ready = False
        self.deadline = None       # when a stopping worker gets SIGKILL
        self.expected_exit = False
        self.generation = generation

    @property
    def worker_id(self):
        return self.index + 1

    @property
    def counts_towards_target(self):
        return self.state in ("booting", "ready")


class Master:
    #: consecutive boot failures after which the master gives up
    max_boot_failures = 5
    #: first backoff delay after a boot failure; doubles each time
    boot_backoff = 0.1
    #: how often private memory is read for --max-worker-memory
    memory_check_interval = 2.0

    def __init__(self, cfg, app, listeners, app_name, *, stats=None):
        self.cfg = cfg
        self.app = app
        self.listeners = listeners
        self.app_name = app_name
        self.stats = stats
        self.target = cfg.workers
        self.workers = {}
        self.scoreboard = Scoreboard()
        self.queue = SignalQueue()
        self.generation = reload.generation_number()
        self.boot_failures = 0
        self.next_spawn_at = 0.0
        self.stopping = None
        self.stop_deadline = None
        #: HUP reloads code and data in a new generation, unless this master
        #: is itself a generation under a supervisor (then HUP restarts workers)
        self.reloadable = reload.role() is None
        self.pending = None
        self.handing_over = False
        self.reload_again = False
        self.announced = False
        self.next_memory_check = 0.0
        self.next_memory_log = 0.0
        self._fork = _original("os", "fork")
        self._waitpid = _original("os", "waitpid")
        self._select = _original("select", "select")

    # --- the loop ---

    def run(self) -> int:
        role = "master" if self.reloadable else f"generation {self.generation}"
        procname.set_title(self.cfg, role, self.app_name)
        self.queue.install(MASTER_SIGNALS, setter=_original("signal", "signal"))
        signals.release()
        log.info("Using master pid %d with %d workers", os.getpid(), self.target)
        try:
            hooks.when_ready(self)
            while True:
                self.dispatch_signals()
                self.reap()
                if self.stopping and not self.workers and self.pending is None:
                    break
                self.murder()
                self.check_reload()
                self.manage()
                self.log_memory()
                autoreload.poll()
                self.sleep()
        except HaltServer as halt:
            log.error("Shutting down: %s", halt.reason)
            self.stop_all(signal.SIGKILL)
            self.wait_all(deadline=time.monotonic() + 5)
            return halt.status
        log.info("Shutting down: master")
        return exits.OK

    def dispatch_signals(self):
        for signum in self.queue.pop_all():
            getattr(self, handler_name(signum))()

    def sleep(self):
        timeout = heartbeat_interval(self.cfg.timeout)
        if self.next_spawn_at > time.monotonic():
            timeout = min(timeout, self.next_spawn_at - time.monotonic())
        watched = [self.queue.wake_r] + (self.stats.filenos() if self.stats else [])
        if self.pending is not None and not self.handing_over:
            watched.append(self.pending.ready_fd)
        try:
            readable, writable, _ = self._select(
                watched, self.stats.writable_filenos() if self.stats else [], [],
                max(0.0, timeout))
        except InterruptedError:
            return
        if self.queue.wake_r in readable:
            self.queue.drain_wakeups()
        if self.stats:
            self.stats.service(readable, writable, self.report)

    # --- signal handlers (called from the loop, never from a signal) ---

    def handle_chld(self):
        pass  # reap() runs on every turn of the loop

    def handle_term(self):
        self.begin_stop("graceful")

    def handle_int(self):
        self.begin_stop("fast")

    handle_quit = handle_int

    def handle_hup(self):
        if self.stopping:
            return
        if self.pending or self.handing_over:
            log.info("Hang up during a reload: reloading again once it is done")
            self.reload_again = True
            return
        if self.reloadable:
            log.info("Hang up: reloading the application in a new generation")
            systemd.notify("RELOADING=1")
            hooks.on_reload()
            hooks.pre_exec()
            self.pending = reload.spawn_generation(self.listeners, self.generation + 1,
                                                   fork=self._fork)
            return
        self.restart_workers()

    def restart_workers(self):
        log.info("Hang up: restarting %d workers gracefully", self.target)
        for record in self.workers.values():
            if record.state in ("booting", "ready"):
                record.state = "retiring"

    # --- reload: hand over to a new generation (forkserve.process.reload) ---

    def check_reload(self):
        if self.pending is not None and self.pending.ready():
            log.info("Generation %d (pid %d) serves; draining the old workers",
                     self.pending.number, self.pending.pid)
            hooks.pre_retire(self.generation)
            self.handing_over = True
            self.stop_deadline = time.monotonic() + self.cfg.graceful_timeout + 1.0
            self.stop_all(signal.SIGTERM)
        if self.handing_over and (not self.workers or time.monotonic() > self.stop_deadline):
            self.stop_all(signal.SIGKILL)
            self.wait_all(time.monotonic() + 5)
            pending, self.pending = self.pending, None
            pending.close()
            reload.exec_supervisor(self.cfg, self.app_name, pending.pid, pending.number,
                                   self.listeners, self.stats.listener if self.stats else None,
                                   reload_again=self.reload_again, queue=self.queue)

    def reload_failed(self, outcome):
        log.error("Reload failed: generation %d (pid %d) %s before it was ready; the old "
                  "generation keeps serving", self.pending.number, self.pending.pid,
                  outcome.description)
        self.pending.close()
        self.pending = None
        # If it died after saying it was ready, our workers are draining:
        # manage() starts fresh ones from the data this master still holds.
        self.handing_over = False

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
        if self.pending is not None:
            os.kill(self.pending.pid, signal.SIGTERM if mode == "graceful" else signal.SIGQUIT)
        systemd.notify("STOPPING=1")
        now = time.monotonic()
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
        while True:
            try:
                pid, status = self._waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if self.pending is not None and pid == self.pending.pid:
                if self.stopping:
                    self.pending.close()
                    self.pending = None
                else:
                    self.reload_failed(exits.classify(status))
                continue
            record = self.workers.pop(pid, None)
            if record is None:
                continue  # not one of ours (e.g. a process the application spawned)
            self.scoreboard.release(record.index)
            hooks.child_exit(record.index, record.pid)
            self.on_worker_exit(record, exits.classify(status))

    def on_worker_exit(self, record, outcome):
        if record.expected_exit or self.stopping:
            log.info("Worker %d (pid %d) %s", record.worker_id, record.pid, outcome.description)
            return
        if not record.ready:
            self.boot_failures += 1
            delay = self.boot_backoff * 2 ** (self.boot_failures - 1)
            self.next_spawn_at = time.monotonic() + delay
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
        now = time.monotonic()
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

    def check_worker_memory(self):
        if any(r.state in ("retiring", "stopping") for r in self.workers.values()):
            return  # one recycle at a time
        limit = self.cfg.max_worker_memory * 1024 * 1024
        for record in self.workers.values():
            if record.state != "ready":
                continue
            reading = reporter.read_process(record.pid)
            if reading is not None and reading.uss > limit:
                log.warning("Worker %d (pid %d) has %.1f MiB private memory, over "
                            "--max-worker-memory %d MiB; recycling it", record.worker_id,
                            record.pid, reading.uss / 2**20, self.cfg.max_worker_memory)
                record.state = "retiring"
                return

    # --- manage: reach the target, retire what was replaced ---

    def manage(self):
        if self.handing_over:
            return
        if self.stopping:
            if time.monotonic() > self.stop_deadline:
                self.stop_all(signal.SIGKILL)
            return
        serving = [r for r in self.workers.values() if r.counts_towards_target]
        missing = self.target - len(serving)
        while missing > 0 and time.monotonic() >= self.next_spawn_at:
            if self.spawn_worker() is None:
                break
            missing -= 1
        if missing < 0:
            extra = sorted(serving, key=lambda r: r.index, reverse=True)[:-missing]
            for record in extra:
                self.stop_worker(record)
        ready = sum(1 for r in serving if r.ready)
        if ready >= self.target and not self.announced:
            self.announced = True
            reload.signal_ready()  # to the supervisor, when this master is a generation
            systemd.notify("READY=1")
        if ready >= self.target:
            for record in list(self.workers.values()):
                if record.state == "retiring":
                    self.stop_worker(record)

    def spawn_worker(self):
        index = self.free_slot()
        if index is None:
            log.error("No free scoreboard slot for another worker")
            return None
        self.scoreboard.prepare(index, self.generation)
        max_requests = self.cfg.max_requests
        if max_requests and self.cfg.max_requests_jitter:
            max_requests += random.randint(0, self.cfg.max_requests_jitter)
        worker = Worker(index, self.app, self.listeners, self.cfg, self.scoreboard,
                        self.app_name, generation=self.generation, max_requests=max_requests,
                        close_fds=self.master_fds())
        hooks.pre_fork(worker)
        pid = self._fork()
        if pid == 0:
            worker.start()  # never returns
        self.scoreboard.set_pid(index, pid)
        self.workers[pid] = WorkerRecord(index, pid, self.generation, time.monotonic())
        return pid

    def free_slot(self):
        used = {record.index for record in self.workers.values()}
        for index in range(self.scoreboard.capacity):
            if index not in used and self.scoreboard.read(index).state == FREE:
                return index
        return None

    def master_fds(self):
        fds = [self.queue.wake_r, self.queue.wake_w]
        if self.stats:
            fds.extend(self.stats.all_filenos())
        return fds

    def stop_worker(self, record, signum=signal.SIGTERM):
        record.state = "stopping"
        record.expected_exit = True
        record.deadline = time.monotonic() + self.cfg.graceful_timeout + 1.0
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
            os.kill(record.pid, signum)
        except ProcessLookupError:
            pass  # already gone; reap() will collect it

    def wait_all(self, deadline):
        while self.workers and time.monotonic() < deadline:
            self.reap()
            if self.workers:
                self._select([self.queue.wake_r], [], [], 0.05)

    # --- memory reporting ---

    def process_infos(self):
        infos = [reporter.ProcessInfo(pid=os.getpid(), role="master", worker_id=None,
                                    requests=None, generation=self.generation)]
        for record in sorted(self.workers.values(), key=lambda r: r.index):
            slot = self.scoreboard.read(record.index)
            infos.append(reporter.ProcessInfo(pid=record.pid, role="worker",
                                            worker_id=record.worker_id,
                                            requests=slot.requests,
                                            generation=record.generation))
        return infos

    def report(self):
        return reporter.collect(self.process_infos())

    def log_memory(self):
        interval = self.cfg.memory_log_interval
        now = time.monotonic()
        if not interval or now < self.next_memory_log:
            return
        self.next_memory_log = now + interval
        reporter.log_report(log, self.report())
