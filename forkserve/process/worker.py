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

import logging
import os
import random
import signal
import time
import traceback

from forkserve.memory import cow, reporter, procfs
from forkserve import exits, logs
from forkserve.process import privileges, procname
from forkserve.process.scoreboard import READY, RETIRE, STOPPING

__all__ = ["Worker", "heartbeat_interval", "make_servers", "preload"]

log = logging.getLogger("forkserve.error")

#: signals whose master handlers must not survive into a worker
_INHERITED = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT, signal.SIGHUP, signal.SIGTTIN,
              signal.SIGTTOU, signal.SIGUSR1, signal.SIGUSR2, signal.SIGCHLD, signal.SIGWINCH)


def heartbeat_interval(timeout: float) -> float:
    """Beat often enough that a healthy worker is never mistaken for a stuck one."""
    if timeout <= 0:
        return 1.0
    return max(0.05, min(1.0, timeout / 4.0))


class Worker:
    def __init__(self, index, app, listeners, cfg, scoreboard, app_name, *, generation=0,
                 max_requests=0, close_fds=()):
        self.index = index
        self.app = app
        self.listeners = listeners
        self.cfg = cfg
        self.scoreboard = scoreboard
        self.app_name = app_name
        self.generation = generation
        self.max_requests = max_requests
        self.close_fds = close_fds
        self.requests = 0
        self.servers = []
        self.stop_mode = None   # None, "graceful" or "fast"
        #: seconds between process-title updates; reading smaps_rollup makes
        #: the kernel walk the process's pages, which stalls this worker's
        #: event loop ~12.5 ms per GB mapped (measured), so not too often
        self.title_interval = 30.0
        self.wakeup = None

    @property
    def worker_id(self):
        return self.index + 1

    # --- after fork ---

    def start(self):
        """Entry point in the child. Never returns."""
        try:
            self.init_process()
            self.boot_servers()
        except BaseException:
            log.error("worker %d failed to boot:\n%s", self.worker_id, traceback.format_exc())
            cow.exit_process(exits.WORKER_BOOT_ERROR)
        try:
            self.run()
        except BaseException:
            log.error("worker %d crashed:\n%s", self.worker_id, traceback.format_exc())
            cow.exit_process(exits.FAILURE)
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
        gevent.signal_handler(signal.SIGTERM, self._request_stop, "graceful")
        gevent.signal_handler(signal.SIGINT, self._request_stop, "fast")
        gevent.signal_handler(signal.SIGQUIT, self._request_stop, "fast")
        gevent.signal_handler(signal.SIGUSR1, logs.reopen)

    def boot_servers(self):
        self.servers = make_servers(self.cfg, self.app, self.listeners, multiprocess=True,
                                    on_request=self._count_request)
        for server in self.servers:
            server.start()
        self.scoreboard.set_state(self.index, READY)
        log.info("Booting worker %d with pid: %d", self.worker_id, os.getpid())

    def run(self):
        import gevent
        interval = heartbeat_interval(self.cfg.timeout)
        next_title = 0.0
        while self.stop_mode is None:
            self.scoreboard.beat(self.index)
            cow.check()
            now = time.monotonic()
            if now >= next_title:
                next_title = now + self.title_interval
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

    def update_title(self):
        """Show requests served and private memory in ps/top."""
        reading = procfs.read_process(os.getpid())
        private = f", {reporter.format_size(reading.uss)} private" if reading else ""
        procname.set_title(self.cfg, f"worker {self.worker_id}", self.app_name,
                           f"{self.requests} req{private}")

    # --- callbacks, run on the worker's event loop ---

    def _request_stop(self, mode):
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

    def _beat_forever(self, interval):
        import gevent
        while True:
            self.scoreboard.beat(self.index)
            gevent.sleep(interval)


def preload():
    """Import, in the master, everything a worker needs after fork.

    Modules imported before the fork are shared by every worker (and frozen
    with the rest of the heap); modules imported after it are one private
    copy per worker, and may not even be readable once --user has dropped
    privileges.
    """
    import gevent.event  # noqa: F401
    import gevent.pool  # noqa: F401
    import gevent.pywsgi  # noqa: F401

    import forkserve.http.handler  # noqa: F401
    import forkserve.http.server  # noqa: F401


def make_servers(cfg, app, listeners, *, multiprocess, on_request):
    """One gevent WSGI server per listening socket, configured from settings."""
    from gevent.pool import Pool

    from forkserve.http.handler import Limits
    from forkserve.http.server import Server

    limits = Limits(limit_request_line=cfg.limit_request_line,
                    limit_request_fields=cfg.limit_request_fields,
                    limit_request_field_size=cfg.limit_request_field_size,
                    limit_request_body=cfg.limit_request_body,
                    header_timeout=cfg.header_timeout,
                    keep_alive=cfg.keep_alive)
    access = logs.access_log if cfg.access_logfile else None
    pool = Pool(cfg.worker_connections)  # one cap for the worker, across its listeners
    return [Server(gevent_socket(listener), app, limits=limits, access_log=access,
                   error_log=logs.error_log, multiprocess=multiprocess,
                   on_request=on_request, pool=pool)
            for listener in listeners]


def gevent_socket(listener):
    """A gevent socket on a duplicate of the inherited listening descriptor."""
    from gevent import socket as gsocket
    return gsocket.socket(listener.family, listener.type, listener.proto,
                          fileno=os.dup(listener.fileno()))
