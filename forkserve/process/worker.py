"""What runs in a worker process after fork.

`Worker.__init__` runs in the master and only stores references. All process
state — signal handlers, the gevent hub, the process title, privileges, the
random seed — is set up in `init_process()`, after fork, in the child.

A worker serves every listening socket with one gevent WSGI server each
(a greenlet per connection), beats its scoreboard slot from its loop, the
loop every forkserve process runs (forkserve.process.driver.Loop), so a
blocked event loop stops the beat (the master then kills it), counts
requests (one add each, stored in its slot before its loop polls: a
store and the limits' checks after each request cost 5% of hello world's
instructions), and asks the master to recycle it when --max-requests is
reached or --max-worker-memory passed: it marks its slot RETIRE and wakes
the master, then serves on, accepting too, until the master tells it to
drain (TERM) once its replacement serves. Asking switches to no greenlet,
so it is safe from any callback of the event loop (the delayed memory
check is a timer's).
Its signal handlers run on the hub and only enqueue, as in the master; the
loop dispatches them, and stops when its master is gone. It ends only
through cow.exit_process(): never into the master's code.

No callback of the event loop may switch greenlets (the hub raises
BlockingSwitchOutError, and what the callback was doing is left half
done): what stops or drains a server runs in the worker's own greenlet,
from its loop. The callbacks, and why each is safe: the request counter's
prepare watcher and the delayed memory check's timer store into the slot,
read /proc and at most ask to be recycled (stores and one write); the
signal watchers run their handlers in a greenlet of their own and only
enqueue; the CPU turns' prepare watcher and the Outbox's callback write
held responses with os.write and shut a failed connection down; the
balance's rawlink on a connection's end stores counts and sets an Event;
the connections' timers throw into their own greenlet
(tests/test_worker_loop.py drives the memory timer and a TERM on a live hub).
"""

import errno
import functools
import logging
import os
import random
import resource
import signal
import time
import traceback

from forkserve.memory import cow, limit, procfs, render, workergc
from forkserve import exits, logs
from forkserve.process import affinity, privileges, procname, signals
from forkserve.process.balance import Admission
from forkserve.process.driver import Loop
from forkserve.process.hooks import Hooks
from forkserve.process.gevent_servers import cpu_turns_for, make_servers, outbox_for
from forkserve.process.scoreboard import READY, RETIRE, STOPPING, heartbeat_interval
from forkserve.process.signals import SignalQueue
from forkserve.process.stop_state import StopState
from forkserve.process.unpatched import original

__all__ = ["Worker"]

log = logging.getLogger("forkserve.error")

#: the signals a worker handles (its loop's handle_<name>())
_HANDLED = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT, signal.SIGUSR1)
#: signals whose master handlers must not survive into a worker
_INHERITED = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT, signal.SIGHUP, signal.SIGTTIN,
              signal.SIGTTOU, signal.SIGUSR1, signal.SIGUSR2, signal.SIGCHLD, signal.SIGWINCH)


class Worker(Loop):
    #: seconds between private-memory readings for the process title;
    #: reading smaps_rollup makes the kernel walk the process's pages,
    #: which stalls this worker's event loop ~12.5 ms per GB mapped
    #: (measured), so not too often. The request count in the title is
    #: refreshed on every turn of the loop (at most once a heartbeat).
    title_interval = 30.0
    #: least seconds between two --max-worker-memory checks after responses:
    #: a response within the gap arms one check at its end instead. Each
    #: check costs ~3 us (benchmarks/memory_check.py, in commit 73eaad6), a hello-world response
    #: ~15 us of CPU; a leak has at most this gap to grow past the limit unseen.
    memory_check_gap = 0.005

    def __init__(self, index, app, listeners, cfg, scoreboard, app_name, *, generation=0,
                 max_requests=0, close_fds=(), number=None, boot_errors=None, hooks=None,
                 cpu=None, wake_master=None):
        self.index = index  # the scoreboard slot
        #: the place in the pool a replacement inherits (forkserve.process.lifecycle)
        self.number = index + 1 if number is None else number
        self.app = app
        self.listeners = listeners
        self.cfg = cfg
        self.scoreboard = scoreboard
        self.app_name = app_name
        self.generation = generation
        self.max_requests = max_requests
        self.close_fds = close_fds
        self.boot_errors = boot_errors  # where a boot failure's error goes to the master
        self.hooks = hooks or Hooks()   # the master's, with their server.pid
        self.cpu = cpu                  # the CPU to pin it to (--cpu-affinity), or None
        #: the write end of the master's wake pipe (signals.wake), or None
        self.wake_master = wake_master
        self._wake_pipe = None  # what that descriptor is, read after fork
        #: the master this worker is forked from (created in it); when it is
        #: gone (SIGKILL), the worker stops rather than serve with no master
        self.parent = self.master_pid = os.getpid()
        self.requests = 0
        self._publisher = None  # the loop's watcher that stores `requests` in the slot
        self.outbox = None  # made after fork (init_process)
        self.servers = []
        self.stop_state = StopState()  # a TERM, an INT or QUIT, or the master gone
        self.clock = time.monotonic
        self.queue = None       # its SignalQueue, made after fork
        self._select = None     # gevent's select, after fork
        self.title = procname.Title(cfg, f"worker {self.worker_id}", app_name)
        self.next_reading = 0.0  # when private memory is next read for the title
        self.private = ""       # ", 12.3 MiB private", as last read
        #: --max-worker-memory checked after responses (memory.limit)
        self.memory_limit = None
        self._next_memory_check = 0.0
        self._memory_timer = None
        self.retiring = False
        self._next_shortage_log = 0.0

    @property
    def worker_id(self):
        return self.number

    # --- after fork ---

    def start(self):
        """Entry point in the child. Never returns."""
        try:
            self.init_process()
            # After init_process: the signals the master blocked across the
            # fork are unblocked, so what the hook starts does not inherit them.
            self.hooks.post_fork(self)
            self.hooks.post_worker_init(self)
            self.boot_servers()
        except BaseException as exc:
            if _out_of_descriptors(exc):
                log.error("worker %d (pid %d) could not start: out of file descriptors (%s; "
                          "the open-files limit is %d): raise it (`ulimit -n`, or LimitNOFILE= "
                          "in a systemd unit) or lower --worker-connections", self.worker_id,
                          os.getpid(), exc, resource.getrlimit(resource.RLIMIT_NOFILE)[0])
                self.hooks.worker_exit(self)
                cow.exit_process(exits.WORKER_RESOURCE_ERROR)
            log.error("worker %d failed to boot:\n%s", self.worker_id, traceback.format_exc())
            if self.boot_errors is not None:
                self.boot_errors.write(self.index, "".join(
                    traceback.format_exception_only(exc)).strip().splitlines()[-1])
            self.hooks.worker_exit(self)
            cow.exit_process(exits.WORKER_BOOT_ERROR)
        try:
            self.run()
        except BaseException:
            log.error("worker %d crashed:\n%s", self.worker_id, traceback.format_exc())
            self.hooks.worker_exit(self)
            cow.exit_process(exits.FAILURE)
        self.hooks.worker_exit(self)
        cow.exit_process(exits.OK)

    def init_process(self):
        for signum in _INHERITED:
            signal.signal(signum, signal.SIG_DFL)
        for fd in self.close_fds:
            try:
                os.close(fd)
            except OSError:
                pass  # already closed
        if self.wake_master is not None:
            self._wake_pipe = _identity(self.wake_master)
        import gevent
        import gevent.select
        gevent.reinit()
        self._select = gevent.select.select
        self.queue = SignalQueue()
        self.scoreboard.beat(self.index)
        random.seed()
        if self.cfg.max_worker_memory:  # opened before privileges drop: /proc/PID is ours now
            read_anonymous, _ = limit.statm_reader(os.getpid())
            self.memory_limit = limit.MemoryLimit(self.cfg.max_worker_memory * 2**20,
                                                  read_anonymous, self._read_private_bytes)
        if self.cpu is not None:  # before the title: a worker titled is a worker pinned
            affinity.pin(self.number, self.cpu)
        self.title.show()
        privileges.drop(self.cfg.user, self.cfg.group)
        cow.check()
        self.gc = workergc.apply(self.cfg.worker_gc,
                                 functools.partial(self.scoreboard.set_gc, self.index))
        #: the Outbox that writes the loop's pass's responses at its end
        #: (batch_responses, on unless --no-batch-responses), or None
        self.outbox = outbox_for(self.cfg)
        #: the sched_yield() between batches (forkserve.process.cpu_turns), or None
        self.cpu_turns = cpu_turns_for(self.cfg, self.outbox)
        self.queue.install(_HANDLED, setter=signals.on_hub)
        signals.release()  # blocked by the master across the fork; pending ones arrive now
        self._make_loop_pipe()

    def _make_loop_pipe(self):
        """Have libev make its wakeup pipe now, while the worker boots.

        libev makes it the first time a watcher needs it, which can be amid
        serving with every descriptor taken: then the hub raises SystemError
        and the worker dies (or libev aborts the process). An async watcher
        started here makes it (unreferenced: it keeps the loop from nothing),
        after os.pipe() proved two descriptors free: that raises
        OSError(EMFILE), which start() reports as a resource error, where
        libev would abort. gevent.idle() runs the loop once through (a
        sleep(0) returns before libev's after-fork step): what libev remakes
        after fork, it remakes now.
        """
        import gevent
        for fd in os.pipe():
            os.close(fd)
        self._loop_pipe = gevent.get_hub().loop.async_(ref=False)
        self._loop_pipe.start(lambda: None)
        gevent.idle()

    def boot_servers(self):
        admission = None if self.cfg.no_balance else Admission(
            self.scoreboard, self.index, original("select", "select"), time.monotonic)
        # A request only adds one to `requests` unless a limit must be checked
        # after it; the scoreboard gets the count before the loop next polls.
        checked = self.max_requests or self.memory_limit is not None
        self.servers = make_servers(self.cfg, self.app, self.listeners, multiprocess=True,
                                    on_request=self._count_and_check if checked
                                    else self._count_request,
                                    hooks=self.hooks, admission=admission,
                                    outbox=self.outbox)
        from gevent import get_hub
        self._publisher = get_hub().loop.prepare(ref=False)  # unreferenced: it keeps no loop
        self._publisher.start(self._publish_requests)
        for server in self.servers:
            server.start()
        # Logged before the master can see READY: a log shows a replacement
        # booting before the worker it replaces is told to leave.
        log.info("Booting worker %d with pid: %d", self.worker_id, os.getpid())
        self.scoreboard.set_state(self.index, READY)
        self._wake_master()  # the worker it replaces, if any, may drain now

    def run(self):
        """Turn the loop until a stop; then close (fast) or drain (graceful)."""
        self.loop()
        if self.stop_state.mode == "fast":
            for server in self.servers:
                server.close_now()
            return
        self.scoreboard.set_state(self.index, STOPPING)
        self.drain(self.servers)  # beating meanwhile

    # --- the steps of a turn (driver.Loop.turn) ---

    def finished(self) -> bool:
        return self.stop_state.mode is not None

    def decide(self):
        self.scoreboard.beat(self.index)
        cow.check()
        self.gc.tick(self.requests)
        now = self.clock()
        if now >= self.next_reading:
            self.next_reading = now + self.title_interval
            self.read_private()
        self.update_title()

    def next_turn_in(self):
        return heartbeat_interval(self.cfg.timeout)

    def while_draining(self):
        self.scoreboard.beat(self.index)

    def log_parent_gone(self):
        log.warning("Worker %d (pid %d): its master (pid %d) is gone; stopping",
                    self.worker_id, os.getpid(), self.master_pid)

    def read_private(self):
        private = self._read_private_bytes()
        self.private = "" if private is None else f", {render.format_size(private)} private"

    def _read_private_bytes(self):
        """This worker's private memory, or None when it cannot be read now.

        Bookkeeping never stops a worker: out of descriptors (or memory),
        the reading is skipped and logged at most once per title interval.
        """
        try:
            reading = procfs.read_process(os.getpid())
        except OSError as exc:
            if exc.errno not in procfs.SHORTAGE_ERRNOS:
                raise
            now = self.clock()
            if now >= self._next_shortage_log:
                self._next_shortage_log = now + self.title_interval
                log.warning("worker %d (pid %d) cannot read its memory from /proc: %s; "
                            "serving on (raise the open-files limit, `ulimit -n` or "
                            "LimitNOFILE=, or lower --worker-connections)",
                            self.worker_id, os.getpid(), exc.strerror)
            return None
        return reading.private if reading else None

    def update_title(self):
        """Show requests served and private memory in ps/top (if either changed)."""
        self.title.show(f"{self.requests} req{self.private}")

    # --- signals, dispatched from the loop ---

    def handle_int(self):
        self.hooks.worker_int(self)
        self.begin_stop("fast")  # a fast one wins

    handle_quit = handle_int

    def handle_usr1(self):
        logs.reopen()

    # --- callbacks, run on the worker's event loop ---

    def _count_request(self):
        self.requests += 1

    def _publish_requests(self):
        self.scoreboard.set_requests(self.index, self.requests)

    def _count_and_check(self):
        self.requests += 1
        if self.retiring:
            return
        if self.max_requests and self.requests == self.max_requests:
            log.info("worker %d served %d requests (--max-requests): asking to be recycled",
                     self.worker_id, self.requests)
            self._retire()
        elif self.memory_limit is not None:
            now = self.clock()
            if now >= self._next_memory_check:
                self._check_memory(now)
            elif self._memory_timer is None:
                from gevent import get_hub
                self._memory_timer = get_hub().loop.timer(self._next_memory_check - now)
                self._memory_timer.start(self._check_memory_later)

    def _check_memory_later(self):
        self._memory_timer.close()
        self._memory_timer = None
        if not self.retiring:
            self._check_memory(self.clock())

    def _check_memory(self, now):
        self._next_memory_check = now + self.memory_check_gap
        if self.scoreboard.read(self.index).state == RETIRE:  # the master found it over first
            self.retiring = True  # and logged it and queued its recycle: nothing to add
            return
        private = self.memory_limit.over()
        if private is not None:
            log.warning("Worker %d (pid %d) has %.1f MiB private memory, over "
                        "--max-worker-memory %d MiB; recycling it", self.worker_id,
                        os.getpid(), private / 2**20, self.cfg.max_worker_memory)
            self._retire()

    def _retire(self):
        """Ask the master to recycle this worker: it forks the replacement at
        once and tells this one to drain (TERM) once that one serves. This
        one serves on meanwhile. Memory stores and a write: it never switches."""
        self.retiring = True
        self.scoreboard.set_state(self.index, RETIRE)
        self._wake_master()

    def _wake_master(self):
        """A byte to the master's wake pipe, if the descriptor is still that
        pipe: an application that closed it (and maybe opened something else
        under its number) gets no byte; the master's next heartbeat reads the
        slot instead."""
        fd = self.wake_master
        if fd is None:
            return
        try:
            same = _identity(fd) == self._wake_pipe
        except OSError as exc:
            if exc.errno != errno.EBADF:
                raise
            same = False
        if same:
            signals.wake(fd)
        else:
            self.wake_master = None


#: what libev's SystemError says when it could not make a descriptor: it
#: reports errno only as text
_SHORTAGE_TEXTS = tuple(os.strerror(code) for code in procfs.SHORTAGE_ERRNOS)


def _identity(fd):
    """(device, inode) of what descriptor `fd` refers to."""
    stat = os.fstat(fd)
    return stat.st_dev, stat.st_ino


def _out_of_descriptors(exc):
    """True if `exc` says the process could not get a file descriptor (or memory)."""
    if isinstance(exc, OSError):
        return exc.errno in procfs.SHORTAGE_ERRNOS
    return isinstance(exc, SystemError) and any(text in str(exc) for text in _SHORTAGE_TEXTS)
