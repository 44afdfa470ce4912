"""Single-process mode (-w 0): the same server in one process, no fork.

This is the mode a PersonDB-style service reaches for when even shared pages
are not enough: one gevent loop, one copy of the data, nothing to copy into.
It keeps the master's discipline (the heap is frozen, the collector stays
off, the process ends through cow.exit_process) and the master's signals
(forkserve.process.signals): HUP reloads through the same hand-over
(forkserve.process.handover): a new single-process generation loads the
current code and data, and once it serves this one drains and becomes its
supervisor.
"""

import logging
import os

import gevent
import gevent.event

from forkserve.memory import cow, reporter
from forkserve import exits, logs
from forkserve.process import autoreload, procname, reload, signals, systemd
from forkserve.process.handover import Handover
from forkserve.process.hooks import Hooks
from forkserve.process.unpatched import original
from forkserve.process.generations import Driver, Generations
from forkserve.process.serving import gevent_socket, make_servers
from forkserve.process.signals import SINGLE_SIGNALS, handler_name

__all__ = ["SingleServer"]

log = logging.getLogger("forkserve.error")


class SingleServer(Driver):
    def __init__(self, cfg, app, listeners, app_name, role=reload.Role(), *,
                 stats_listener=None, hooks=None):
        self.cfg = cfg
        self.hooks = hooks or Hooks()
        self.app = app
        self.listeners = listeners
        self.app_name = app_name
        self.stats_listener = stats_listener
        self.requests = 0
        self.stop_mode = None
        self.wakeup = None
        self.hups = 0
        self.role = role
        self.generation = role.generation
        self.handover = Handover(serving=self.generation, owner_serves=True,
                                 graceful_timeout=cfg.graceful_timeout)
        self.generations = Generations(listeners, fork=original("os", "fork"))
        self.draining = False
        self.clock = _now
        #: a generation's supervisor: when it is gone (SIGKILL), this generation stops
        self.parent = os.getppid() if role.supervised else None

    def run(self) -> int:
        procname.set_title(self.cfg, f"generation {self.generation}" if self.role.supervised
                           else "single", self.app_name)
        self._install_signal_handlers()
        servers = make_servers(self.cfg, self.app, self.listeners, multiprocess=False,
                               on_request=self._count_request, hooks=self.hooks)
        for server in servers:
            server.start()
        stats_server = self._start_stats()
        log.info("Serving from a single process, pid %d (no workers)", os.getpid())
        self.hooks.when_ready(single=self)
        reload.signal_ready(self.role)
        systemd.notify("READY=1")
        self._serve_until_stop_or_handover()
        if self.stop_mode == "fast":
            log.info("Shutting down: fast stop")
            for server in servers:
                server.close_now()
        else:
            log.info("%s: draining in-flight requests (up to %gs)",
                     "Handing over" if self.draining else "Shutting down",
                     self.cfg.graceful_timeout)
            gevent.joinall([gevent.spawn(server.drain, self.cfg.graceful_timeout)
                            for server in servers])
        if stats_server is not None:  # it answered /health with 503 while draining
            stats_server.close_now()
        if self.draining:  # a new generation serves: supervise it, unless told to stop
            self._dispatch_hups()  # one during the drain: the supervisor reloads again
            if self.stop_mode is not None:
                self.apply(self.handover.stop(self.stop_mode, _now()))
            self.apply(self.handover.gone(self.generation, "drained", _now()))
        self._wait_for_generations()
        return exits.OK

    def _wait_for_generations(self):
        """Stopping: boot.run leaves no child running. The generations told to
        stop are reaped; the hand-over forces out those that stay."""
        while self.generations.pids:
            self._reap_generations()
            self.apply(self.handover.tick(_now()))
            if self.generations.pids:
                self.wakeup.wait(0.05)  # SIGCHLD is not watched: poll
                self.wakeup.clear()

    def _install_signal_handlers(self):
        self.wakeup = gevent.event.Event()
        for signum in SINGLE_SIGNALS:  # run on the event loop, not in a signal handler
            gevent.signal_handler(signum, getattr(self, handler_name(signum)))
        signals.release()

    def _serve_until_stop_or_handover(self):
        next_memory_log = 0.0
        while self.stop_mode is None and not self.draining:
            cow.check()
            autoreload.poll()
            if self.supervisor_gone():
                self._request_stop("graceful")
                break
            now = _now()
            self._dispatch_hups()
            self._reap_generations()
            self.follow_generations()  # the clock: a generation that loads too long
            interval = self.cfg.memory_log_interval
            if interval and now >= next_memory_log:
                next_memory_log = now + interval
                reporter.log_report(log, self.report())
            self.wakeup.wait(0.1 if self.handover.busy else min(1.0, interval or 1.0))
            self.wakeup.clear()
        if self.stop_mode is not None:
            self.apply(self.handover.stop(self.stop_mode, _now()))

    def _dispatch_hups(self):
        hups, self.hups = self.hups, 0
        for _ in range(hups):
            self.apply(self.handover.hup(_now()))

    def _reap_generations(self):
        waitpid = original("os", "waitpid")
        for pid in list(self.generations.pids.values()):
            try:
                reaped, status = waitpid(pid, os.WNOHANG)
            except ChildProcessError:  # no longer our child to wait for: it is gone
                description = "is gone (its exit status was collected elsewhere)"
            else:
                if not reaped:
                    continue
                description = exits.classify(status).description
            self.generation_exited(pid, description)

    # --- what the hand-over asks of this process (generations.Driver) ---

    def retire(self, number):
        self.hooks.pre_retire(self.generation)
        self.draining = True  # the loop ends; run() drains, then hands over

    def become_supervisor(self, action):
        reload.exec_supervisor(self.cfg, self.app_name, self.generations.pid(action.number),
                               action.number, self.listeners, self.stats_listener,
                               reload_again=action.reload_again)

    def serving(self):
        """GET /health on --stats: this process serves and is not stopping."""
        return self.stop_mode is None

    def report(self):
        if self.generations.pids:  # a reload: the tree has a generation under us
            return reporter.collect(reporter.discover(os.getpid()))
        return reporter.collect([reporter.ProcessInfo(pid=os.getpid(), role="single",
                                                      worker_id=None, requests=self.requests,
                                                      generation=self.generation)])

    def _start_stats(self):
        if self.stats_listener is None:
            return None
        import gevent

        from forkserve.http import stats
        from forkserve.http.server import Server
        from forkserve.memory.history import History

        history = History()
        server = Server(gevent_socket(self.stats_listener),
                        stats.wsgi_app(self.report, self.serving, history),
                        error_log=logs.error_log, multiprocess=False, worker_connections=16)
        server.start()
        gevent.spawn(stats.sample_forever, history, self.report)
        return server

    # --- signals (forkserve.process.signals), run on the event loop ---

    def handle_term(self):
        self._request_stop("graceful")

    def handle_int(self):
        self._request_stop("fast")

    handle_quit = handle_int

    def handle_hup(self):
        if self.role.supervised:
            log.info("Reload signal ignored: this process is a generation; send it to the "
                     "master (the supervisor)")
        else:  # the loop hands it to the hand-over, which remembers one during a reload
            self.hups += 1
            self.wakeup.set()

    handle_usr2 = handle_hup

    def handle_usr1(self):
        logs.reopen(self.cfg)

    def handle_ttin(self):
        self._not_here("TTIN")

    def handle_ttou(self):
        self._not_here("TTOU")

    def _request_stop(self, mode):
        if self.stop_mode != "fast":
            self.stop_mode = mode
        self.wakeup.set()

    def _not_here(self, name):
        log.info("%s ignored: a single-process server (-w 0) has no workers to change; "
                 "run with -w N to use it", name)

    def _count_request(self):
        self.requests += 1


def _now():
    return gevent.get_hub().loop.now()
