"""The master (-w N): spawn, reap, murder and manage workers; carry out a
reload; watch the workers' memory.

The master has already loaded the application and hardened its memory
(cow.harden) when it gets here; every worker is a fork of it. Its loop (the
one every driver runs, forkserve.process.driver) does no application work
and allocates little, so the pages it shares with the workers stay clean:

    dispatch signals -> parent gone? -> reap (workers, generations)
      -> finished? -> decide (murder: timeouts, memory; the reload; manage)
      -> wait (select: a signal, or a worker's wake-up)

A worker wakes the master (a byte on its wake pipe, the one signals write
to) when its slot says something the master acts on at once: it serves
(READY: a replacement's worker may now drain) or asks to be recycled
(RETIRE: its replacement is forked). A worker's exit wakes it through
SIGCHLD. So a recycle waits for no heartbeat: the master forks the
replacement as soon as the worker asks, and stops the old one as soon as
the replacement serves.

Signal handlers only enqueue (forkserve.process.signals); `handle_<name>()`
methods run from the loop. The master waits with the original select(),
fork() and waitpid() even when gevent has monkey-patched them for the
application: the master never runs a gevent hub, and it says in its log when
it is not single-threaded as it forks (forkserve.process.threads). Right
before each fork, forkserve.memory.free_space takes the allocators' free
space, so the new worker's allocations land on fresh pages, not in the holes
between the master's objects.

What to do with the workers (fork one, replace one that died after a
backoff, recycle replacement first, stop one, give up after repeated boot
failures) is decided by forkserve.process.lifecycle, a pure state machine;
murder() and manage() feed it what the scoreboard and the clock say, reap()
feeds it the exits, and the driver's apply() does what it decides.

A reload (HUP) is decided by forkserve.process.handover, shared with the
single-process server and the supervisor; the master only carries out its
actions (driver.Driver.apply): spawn the generation, drain its own workers
once it serves, exec into the supervisor once they are gone.
"""

import logging
import os
import random
import signal
import time

from forkserve import exits, statsd
from forkserve.memory import copied_objects, free_space, model, procfs
from forkserve.process import (affinity, generation_protocol, procname, signals, source_watch,
                               systemd, threads)
from forkserve.process.boot_errors import BootErrors
from forkserve.process.driver import FORK_ERRNOS, Driver
from forkserve.process.generations import Generations
from forkserve.process.handover import Handover
from forkserve.process.hooks import Hooks
from forkserve.process.lifecycle import Lifecycle
from forkserve.process.scoreboard import FREE, READY, RETIRE, Scoreboard, heartbeat_interval
from forkserve.process.signals import MASTER_SIGNALS, SignalQueue
from forkserve.process.stop_state import StopState
from forkserve.process.unpatched import original
from forkserve.process.worker import Worker

__all__ = ["Master"]

log = logging.getLogger("forkserve.error")


class Master(Driver):
    #: how often private memory is read for --max-worker-memory
    memory_check_interval = 2.0

    def __init__(self, cfg, app, listeners, app_name, role=generation_protocol.Role(), *, stats=None,
                 hooks=None, fork=None, waitpid=None, kill=os.kill, select=None,
                 clock=time.monotonic):
        self.cfg = cfg
        self.hooks = hooks or Hooks()  # the config file's; its workers get them too
        self.app = app
        self.listeners = listeners
        self.app_name = app_name
        self.stats = stats
        #: the one stop state, shared by the lifecycle and the hand-over
        self.stop_state = StopState()
        #: what to do with the workers: forkserve.process.lifecycle decides,
        #: this master reads their slots and exits and carries it out
        self.lifecycle = Lifecycle(cfg.workers, timeout=cfg.timeout,
                                   graceful_timeout=cfg.graceful_timeout,
                                   abort_first=self.hooks.installed("worker_abort"),
                                   stop_state=self.stop_state)
        self.scoreboard = Scoreboard(clock=clock)  # its beats, on the master's clock
        self.boot_errors = BootErrors(self.scoreboard.capacity)
        self.queue = SignalQueue()
        self.role = role
        self.generation = role.generation
        #: HUP reloads code and data in a new generation, unless this master
        #: is itself a generation under a supervisor (then HUP restarts workers)
        self.reloadable = not role.supervised
        #: a generation's supervisor: when it is gone (SIGKILL), this generation stops
        self.parent = os.getppid() if role.supervised else None
        self.next_memory_check = 0.0
        self._fork = threads.unwarned(fork or original("os", "fork"))
        self._waitpid = waitpid or original("os", "waitpid")
        self._kill = kill
        self._select = select or original("select", "select")
        self.clock = clock
        self.handover = Handover(serving=self.generation, owner_serves=True,
                                 graceful_timeout=cfg.graceful_timeout,
                                 stop_state=self.stop_state)
        self.generations = Generations(listeners, fork=self._fork, kill=kill)
        #: warns when the master is not single-threaded as it forks a worker
        self.thread_watch = threads.ThreadWatch()
        self.why = None  # the --why listener, opened by run()
        self.title = procname.Title(cfg, "master" if self.reloadable
                                    else f"generation {self.generation}", app_name)

    @property
    def workers(self):
        """pid -> WorkerRecord of every worker not yet reaped."""
        return self.lifecycle.workers

    @property
    def target(self):
        return self.lifecycle.target

    # --- the loop ---

    def run(self) -> int:
        self.title.show()
        self.queue.install(MASTER_SIGNALS, setter=original("signal", "signal"))
        self.why = copied_objects.listen(self.app_name, fork=self._fork)  # forkserve memory --why
        signals.release()
        if self.reloadable:
            log.info("Using master pid %d with %s", os.getpid(), _count_workers(self.target))
        else:  # its own pid is not the one to signal: its supervisor's (the pid file's) is
            log.info("Generation %d runs in pid %d with %s; send signals to the master, pid "
                     "%d (the pid file's)", self.generation, os.getpid(),
                     _count_workers(self.target), self.parent or os.getppid())
        cpus = os.sched_getaffinity(0)
        if affinity.choose(self.cfg.cpu_affinity, 1, self.target, cpus) is not None:
            log.info("Pinning each worker to one of %d CPUs (--cpu-affinity %s%s)", len(cpus),
                     self.cfg.cpu_affinity, ": more workers than CPUs; off to let them move"
                     if self.cfg.cpu_affinity == "auto" else "")
        return self.serve()

    def begin(self):
        self.hooks.when_ready(self)

    def halt(self):
        # halting from here on: a hook raising while the rest are reaped halts nothing more
        self.apply(self.lifecycle.halt())
        super().halt()  # a reload under way stops too
        self.reap_until(lambda: not self.workers, deadline=self.clock() + 5)

    # --- the steps of a turn (driver.Driver.turn) ---

    def finished(self) -> bool:
        """Stopped, with no worker and no generation left."""
        return bool(self.stopping) and not self.workers and not self.generations.pids

    def decide(self):
        self.murder()
        self.check_reload()
        self.manage()
        self.log_memory()
        source_watch.poll()

    def next_turn_in(self):
        """A heartbeat, or less when a worker is due to be forked (or a
        queued recycle to start) sooner."""
        timeout = heartbeat_interval(self.cfg.timeout)
        due = [self.lifecycle.next_spawn_at, self.lifecycle.next_recycle_at()]
        waits = [at - self.clock() for at in due if at is not None]
        return min([timeout] + [wait for wait in waits if wait > 0])

    # --- signal handlers (called from the loop, never from a signal) ---

    def handle_hup(self):
        if self.reloadable:
            self.apply(self.handover.hup(self.clock()))
        elif not self.stopping:
            self.restart_workers()

    handle_usr2 = handle_hup

    def restart_workers(self):
        log.info("Hang up: restarting %d workers gracefully", self.target)
        self.lifecycle.retire_all(self.clock())

    def resize_own(self, signum):
        """TTIN or TTOU for this master's own workers (the hand-over decides
        whose they are: during a reload, the incoming generation's)."""
        if signum == signal.SIGTTIN:
            if self.target >= self.scoreboard.capacity // 2:
                log.warning("TTIN ignored: already at %d workers", self.target)
                return
            self.lifecycle.target += 1
            log.info("TTIN: %s", _count_workers(self.target))
            self.hooks.nworkers_changed(self.target, self.target - 1)
            return
        if self.target <= 1:
            log.info("TTOU ignored: at least one worker is kept")
            return
        self.lifecycle.target -= 1
        log.info("TTOU: %s", _count_workers(self.target))
        self.hooks.nworkers_changed(self.target, self.target + 1)

    def handle_usr1(self):
        from forkserve import logs
        logs.reopen(self.cfg)
        self.signal_workers(signal.SIGUSR1)

    def stop_own(self, mode, now):
        kills = self.lifecycle.stop_workers(now)  # the workers, told the same
        systemd.notify("STOPPING=1")
        if mode == "graceful":
            log.info("Handling signal: term (graceful stop, up to %gs)", self.cfg.graceful_timeout)
        else:
            log.info("Handling signal: fast stop")
        self.apply(kills)

    # --- reap (driver.Driver.reap: a worker's exit, to the lifecycle) ---

    def worker_exited(self, pid, outcome):
        record = self.workers.get(pid)
        if record is None:
            return  # not one of ours (e.g. a process the application spawned)
        # it said it serves (its slot), even if no turn of the loop saw it yet
        said_ready = self.scoreboard.read(record.index).state >= READY
        actions = self.lifecycle.exited(pid, outcome, self.clock(), said_ready=said_ready,
                                        error=self.boot_errors.take(record.index))
        self.scoreboard.release(record.index)
        halt = None
        for call in (lambda: self.hooks.child_exit(record.index, pid),
                     lambda: self.apply(actions)):
            try:
                call()
            except exits.HaltServer as raised:  # a hook that halts: the exit is still seen to
                halt = halt or raised
        if halt is not None:
            raise halt

    # --- murder: timeouts, drain deadlines, memory limits ---

    def murder(self):
        """Timeouts, drain deadlines, readiness and recycle requests, from the slots."""
        now = self.clock()
        for record in list(self.workers.values()):
            slot = self.scoreboard.read(record.index)
            self.apply(self.lifecycle.observed(
                record.pid, now, beat=slot.beat, said_ready=slot.state >= READY,
                asked_retire=slot.state == RETIRE))
        if self.cfg.max_worker_memory and now >= self.next_memory_check:
            self.next_memory_check = now + self.memory_check_interval
            self.check_worker_memory()

    # --- manage: reach the target, retire what was replaced ---

    def manage(self):
        # while our workers drain for a new generation, none is replaced
        self.apply(self.lifecycle.tick(
            self.clock(), replace=not self.draining))
        statsd.workers(len(self.workers))  # a gauge when the count changes, as Gunicorn

    def serving(self):
        """GET /health on --stats: the workers were all up once and no stop is under way."""
        return self.lifecycle.announced and not self.stopping

    def spawn_worker(self):
        index = self.free_slot()
        if index is None:
            log.error("No free scoreboard slot for another worker")
            return None
        self.scoreboard.prepare(index)
        max_requests = self.cfg.max_requests
        if max_requests and self.cfg.max_requests_jitter:
            max_requests += random.randint(0, self.cfg.max_requests_jitter)
        number = self.lifecycle.free_number()
        cpu = affinity.choose(self.cfg.cpu_affinity, number, self.target, os.sched_getaffinity(0))
        worker = Worker(index, self.app, self.listeners, self.cfg, self.scoreboard,
                        self.app_name, generation=self.generation, max_requests=max_requests,
                        close_fds=self.master_fds(), number=number,
                        wake_master=self.queue.wake_w,
                        boot_errors=self.boot_errors, hooks=self.hooks, cpu=cpu)
        self.hooks.pre_fork(worker)
        self.thread_watch.before_fork()
        # Until the worker has its own handlers, a signal sent to it (a TERM
        # right after the fork) must wait, not run the master's handler in it
        # and be lost: the worker unblocks them in init_process().
        signals.hold()
        try:
            # the worker allocates off the master's pages (--no-take-free-space: not)
            free_space.before_fork(self.cfg.take_free_space)
            pid = self._fork()
            if pid == 0:
                worker.start()  # never returns
        except OSError as exc:
            if exc.errno not in FORK_ERRNOS:
                raise
            self.scoreboard.release(index)
            self.apply(self.lifecycle.fork_failed(self.clock(), exc.strerror))
            return None
        finally:
            signals.release()
        self.lifecycle.forked(index, pid, self.generation, number)
        return pid

    def free_slot(self):
        used = {record.index for record in self.workers.values()}
        for index in range(self.scoreboard.capacity):
            if index not in used and self.scoreboard.read(index).state == FREE:
                return index
        return None

    def master_fds(self):
        """Descriptors a worker closes: the master's own (but the write end of
        its wake pipe, which the worker keeps to wake it), and the reload pipes
        (a worker holding a ready pipe would hide its generation's death)."""
        fds = [self.queue.wake_r] + (self.why.filenos() if self.why else [])
        fds += self.generations.waiting_fds()
        if self.role.ready_fd is not None and not self.lifecycle.announced:  # closed once announced
            fds.append(self.role.ready_fd)
        if self.stats:
            fds.extend(self.stats.all_filenos())
        return fds

    def signal_workers(self, signum):
        for record in self.workers.values():
            self.kill(record.pid, signum)

    def kill(self, pid, signum):
        try:
            self._kill(pid, signum)
        except ProcessLookupError:
            pass  # already gone; reap() will collect it

    # --- a reload: forkserve.process.handover decides, these carry it out ---

    def check_reload(self):
        self.follow_generations()
        if self.draining and not self.workers:
            self.apply(self.handover.gone(self.generation, "drained", self.clock()))
        if self.title.shown and self.handover.serving == self.generation:
            # the new generation died while ours drained: ours serves again
            self.title.show()

    def retire(self, number):
        if number == self.generation:
            self.hooks.pre_retire(self.generation)
            # `forkserve memory --pid` reads from the title which generation serves
            self.title.show(f"serving generation {self.handover.serving}")
            # each with its own SIGKILL deadline: the hand-over's ends if
            # the new generation dies meanwhile
            self.apply(self.lifecycle.drain(self.clock()))
        else:
            self.generations.signal(number, signal.SIGTERM)

    def kill_own_workers(self):
        # murder() SIGKILLs each retired worker at its own deadline (and
        # clears it); this catches any still waiting for theirs.
        self.apply(self.lifecycle.kill_draining(self.generation))

    # --- memory: --max-worker-memory, --memory-log-interval, the stats report ---

    def check_worker_memory(self):
        """Queue for recycling every ready worker over --max-worker-memory
        (the lifecycle replaces them one at a time)."""
        limit = self.cfg.max_worker_memory * 1024 * 1024
        now = self.clock()
        for record in self.workers.values():
            if record.state != "ready" or self.lifecycle.asked(record.pid):
                continue
            reading = procfs.read_process(record.pid)
            if reading is not None and reading.private > limit:  # anonymous: copies, not files
                log.warning("Worker %d (pid %d) has %.1f MiB private memory, over "
                            "--max-worker-memory %d MiB; recycling it", record.worker_id,
                            record.pid, reading.private / 2**20, self.cfg.max_worker_memory)
                self.lifecycle.retire(record.pid, now)
                # the worker's own check then says nothing more (one line per recycle)
                self.scoreboard.set_state(record.index, RETIRE)

    def process_infos(self):
        infos = [model.ProcessInfo(pid=os.getpid(), role="master", worker_id=None,
                                    requests=None, generation=self.generation)]
        for record in sorted(self.workers.values(), key=lambda r: (r.number, r.index)):
            slot = self.scoreboard.read(record.index)
            # A retiring worker has handed its number to its replacement.
            leaving = "draining" if record.state in ("retiring", "stopping") else None
            infos.append(model.ProcessInfo(pid=record.pid, role="worker",
                                            worker_id=record.worker_id,
                                            requests=slot.requests,
                                            generation=record.generation, state=leaving,
                                            gc_collections=slot.gc_collections,
                                            gc_pause=slot.gc_pause_ns / 1e9,
                                            connections=slot.connections,
                                            accepted=slot.accepted))
        return infos


def _count_workers(count):
    return f"{count} worker" + ("" if count == 1 else "s")
