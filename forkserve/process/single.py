"""Single-process mode (-w 0): the same server in one process, no fork.

This is the mode a PersonDB-style service reaches for when even shared pages
are not enough: one gevent loop, one copy of the data, nothing to copy into.
It keeps the master's discipline (the heap is frozen, the collector stays
off, the process ends through cow.exit_process) and the master's signals:
TERM drains in-flight requests, INT and QUIT stop at once, USR1 reopens logs,
HUP reloads: a new single-process generation loads the current code and
data, and once it serves this one drains and becomes its supervisor
(forkserve.process.reload).
"""

import logging
import os
import signal

from gevent import monkey

from forkserve.memory import cow, reporter
from forkserve import exits, logs
from forkserve.process import autoreload, hooks, procname, reload, signals, systemd
from forkserve.process.worker import make_servers

__all__ = ["SingleServer"]

log = logging.getLogger("forkserve.error")


class SingleServer:
    def __init__(self, cfg, app, listeners, app_name, *, stats_listener=None):
        self.cfg = cfg
        self.app = app
        self.listeners = listeners
        self.app_name = app_name
        self.stats_listener = stats_listener
        self.requests = 0
        self.stop_mode = None
        self.wakeup = None
        self.reload_requested = False
        self.pending = None

    def run(self) -> int:
        import gevent
        import gevent.event

        role = "single" if reload.role() is None else f"generation {reload.generation_number()}"
        procname.set_title(self.cfg, role, self.app_name)
        self.wakeup = gevent.event.Event()
        gevent.signal_handler(signal.SIGTERM, self._request_stop, "graceful")
        gevent.signal_handler(signal.SIGINT, self._request_stop, "fast")
        gevent.signal_handler(signal.SIGQUIT, self._request_stop, "fast")
        gevent.signal_handler(signal.SIGUSR1, logs.reopen)
        gevent.signal_handler(signal.SIGHUP, self._request_reload)
        for signum in (signal.SIGTTIN, signal.SIGTTOU):
            gevent.signal_handler(signum, self._not_here, signal.Signals(signum).name)
        signals.release()

        servers = make_servers(self.cfg, self.app, self.listeners, multiprocess=False,
                               on_request=self._count_request)
        for server in servers:
            server.start()
        stats_server = self._start_stats()
        log.info("Serving from a single process, pid %d (no workers)", os.getpid())
        hooks.when_ready(single=self)
        reload.signal_ready()
        systemd.notify("READY=1")
        next_memory_log = 0.0
        while self.stop_mode is None:
            cow.check()
            autoreload.poll()
            if self.reload_requested and self.pending is None:
                self.reload_requested = False
                self._start_generation()
            if self.pending is not None and self._generation_ready():
                break
            interval = self.cfg.memory_log_interval
            if interval and gevent.get_hub().loop.now() >= next_memory_log:
                next_memory_log = gevent.get_hub().loop.now() + interval
                reporter.log_report(log, self.report())
            self.wakeup.wait(0.1 if self.pending else min(1.0, interval or 1.0))
            self.wakeup.clear()
        if stats_server is not None:
            stats_server.stop(timeout=0)
        if self.stop_mode is None:  # a new generation serves: drain, then supervise it
            gevent.joinall([gevent.spawn(server.drain, self.cfg.graceful_timeout)
                            for server in servers])
            pending, self.pending = self.pending, None
            pending.close()
            reload.exec_supervisor(self.cfg, self.app_name, pending.pid, pending.number,
                                   self.listeners, self.stats_listener,
                                   reload_again=self.reload_requested)
        if self.pending is not None:
            os.kill(self.pending.pid, signal.SIGTERM)
        if self.stop_mode == "fast":
            log.info("Shutting down: fast stop")
            for server in servers:
                server.close_now()
        else:
            log.info("Shutting down: draining in-flight requests (up to %gs)",
                     self.cfg.graceful_timeout)
            gevent.joinall([gevent.spawn(server.drain, self.cfg.graceful_timeout)
                            for server in servers])
        return exits.OK

    def report(self):
        return reporter.collect([reporter.ProcessInfo(pid=os.getpid(), role="single",
                                                  worker_id=None, requests=self.requests)])

    def _start_stats(self):
        if self.stats_listener is None:
            return None
        from gevent.pywsgi import WSGIServer
        from forkserve.http import stats
        from forkserve.process.worker import gevent_socket

        server = WSGIServer(gevent_socket(self.stats_listener), stats.wsgi_app(self.report),
                            log=None, error_log=logs.error_log)
        server.start()
        return server

    def _request_stop(self, mode):
        if self.stop_mode != "fast":
            self.stop_mode = mode
        self.wakeup.set()

    def _request_reload(self):
        if reload.role() is not None:
            log.info("HUP ignored: this process is a generation; send HUP to the master")
        else:  # during a reload, remembered and done once this one is over
            self.reload_requested = True
            self.wakeup.set()

    def _start_generation(self):
        log.info("Hang up: reloading the application in a new generation")
        systemd.notify("RELOADING=1")
        self.pending = reload.spawn_generation(self.listeners, reload.generation_number() + 1,
                                               fork=monkey.get_original("os", "fork"))

    def _generation_ready(self):
        if self.pending.ready():
            log.info("Generation %d (pid %d) serves; draining this one", self.pending.number,
                     self.pending.pid)
            return True
        pid, status = monkey.get_original("os", "waitpid")(self.pending.pid, os.WNOHANG)
        if pid:
            log.error("Reload failed: generation %d (pid %d) %s before it was ready; this "
                      "process keeps serving", self.pending.number, pid,
                      exits.classify(status).description)
            self.pending.close()
            self.pending = None
        return False

    def _not_here(self, name):
        log.info("%s ignored: a single-process server (-w 0) has no workers to change; "
                 "run with -w N to use it", name)

    def _count_request(self):
        self.requests += 1
