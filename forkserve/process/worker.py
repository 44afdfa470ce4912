"""What runs in a worker process after fork.

`Worker.__init__` runs in the master and only stores references. All process
state — signal handlers, the gevent hub, the process title, privileges, the
random seed — is set up in `init_process()`, after fork, in the child.

A worker serves every listening socket with one gevent WSGI server each
(a greenlet per connection), beats its scoreboard slot from a greenlet so a
blocked event loop stops the beat (the master then kills it), counts
requests, and asks the master to recycle it when --max-requests is reached.
It ends only through cow.exit_process(): never into the master's code.
"""

import functools
import logging
import os
import random
import signal
import time
import traceback

from forkserve.memory import cow, reporter, procfs, workergc
from forkserve import exits, logs
from forkserve.process import privileges, procname, signals
from forkserve.process.hooks import Hooks
from forkserve.process.serving import make_servers
from forkserve.process.scoreboard import READY, RETIRE, STOPPING, heartbeat_interval

__all__ = ["Worker"]

log = logging.getLogger("forkserve.error")

#: signals whose master handlers must not survive into a worker
_INHERITED = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT, signal.SIGHUP, signal.SIGTTIN,
              signal.SIGTTOU, signal.SIGUSR1, signal.SIGUSR2, signal.SIGCHLD, signal.SIGWINCH)


class Worker:
    def __init__(self, index, app, listeners, cfg, scoreboard, app_name, *, generation=0,
                 max_requests=0, close_fds=(), boot_errors=None, hooks=None):
        self.index = index
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
        #: the master this worker is forked from (created in it); when it is
        #: gone (SIGKILL), the worker stops rather than serve with no master
        self.master_pid = os.getpid()
        self.requests = 0
        self.servers = []
        self.stop_mode = None   # None, "graceful" or "fast"
        #: seconds between private-memory readings for the process title;
        #: reading smaps_rollup makes the kernel walk the process's pages,
        #: which stalls this worker's event loop ~12.5 ms per GB mapped
        #: (measured), so not too often. The request count in the title is
        #: refreshed on every turn of the loop (at most once a heartbeat).
        self.title_interval = 30.0
        self.private = ""       # ", 12.3 MiB private", as last read
        self.titled = None      # the request count the title shows
        self.wakeup = None

    @property
    def worker_id(self):
        return self.index + 1

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
        import gevent
        import gevent.event
        gevent.reinit()
        self.wakeup = gevent.event.Event()
        self.scoreboard.beat(self.index)
        random.seed()
        procname.set_title(self.cfg, f"worker {self.worker_id}", self.app_name)
        privileges.drop(self.cfg.user, self.cfg.group)
        cow.check()
        self.gc = workergc.apply(self.cfg.worker_gc, functools.partial(self.scoreboard.set_gc,
                                                                        self.index))
        gevent.signal_handler(signal.SIGTERM, self._request_stop, "graceful")
        gevent.signal_handler(signal.SIGINT, self._request_stop, "fast")
        gevent.signal_handler(signal.SIGQUIT, self._request_stop, "fast")
        gevent.signal_handler(signal.SIGUSR1, logs.reopen)
        signals.release()  # blocked by the master across the fork; pending ones arrive now

    def boot_servers(self):
        self.servers = make_servers(self.cfg, self.app, self.listeners, multiprocess=True,
                                    on_request=self._count_request, hooks=self.hooks)
        for server in self.servers:
            server.start()
        # Logged before the master can see READY: a log shows a replacement
        # booting before the worker it replaces is told to leave.
        log.info("Booting worker %d with pid: %d", self.worker_id, os.getpid())
        self.scoreboard.set_state(self.index, READY)

    def run(self):
        import gevent
        interval = heartbeat_interval(self.cfg.timeout)
        next_reading = 0.0
        while self.stop_mode is None:
            if os.getppid() != self.master_pid:
                log.warning("Worker %d (pid %d): its master (pid %d) is gone; stopping",
                            self.worker_id, os.getpid(), self.master_pid)
                self.stop_mode = "graceful"
                break
            self.scoreboard.beat(self.index)
            cow.check()
            self.gc.tick(self.requests)
            now = time.monotonic()
            if now >= next_reading:
                next_reading = now + self.title_interval
                self.read_private()
            self.update_title()
            self.wakeup.wait(interval)
            self.wakeup.clear()
        if self.stop_mode == "fast":
            for server in self.servers:
                server.close_now()
            return
        self.scoreboard.set_state(self.index, STOPPING)
        beating = gevent.spawn(self._beat_forever, interval)
        drains = [gevent.spawn(server.drain, self.cfg.graceful_timeout)
                  for server in self.servers]
        gevent.joinall(drains)
        beating.kill()

    def read_private(self):
        reading = procfs.read_process(os.getpid())
        self.private = f", {reporter.format_size(reading.private)} private" if reading else ""
        self.titled = None  # shown on the next update_title()

    def update_title(self):
        """Show requests served and private memory in ps/top (if either changed)."""
        if self.titled == self.requests:
            return
        self.titled = self.requests
        procname.set_title(self.cfg, f"worker {self.worker_id}", self.app_name,
                           f"{self.requests} req{self.private}")

    # --- callbacks, run on the worker's event loop ---

    def _request_stop(self, mode):
        if mode == "fast":
            self.hooks.worker_int(self)
        if self.stop_mode != "fast":
            self.stop_mode = mode
        self.wakeup.set()

    def _count_request(self):
        self.requests += 1
        self.scoreboard.count_request(self.index)
        if self.max_requests and self.requests == self.max_requests:
            log.info("worker %d served %d requests (--max-requests): asking to be recycled",
                     self.worker_id, self.requests)
            self.scoreboard.set_state(self.index, RETIRE)
            for server in self.servers:  # no new connections; each closes after its next response
                server.retire()

    def _beat_forever(self, interval):
        import gevent
        while True:
            self.scoreboard.beat(self.index)
            gevent.sleep(interval)
