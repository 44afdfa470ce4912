"""Single-process mode (-w 0): the same server in one process, no fork.

This is the mode a PersonDB-style service reaches for when even shared pages
are not enough: one gevent loop, one copy of the data, nothing to copy into.
It keeps the master's discipline (the heap is frozen, the collector stays
off, the process ends through cow.exit_process) and the master's signals
(forkserve.process.signals): HUP reloads through the same hand-over
(forkserve.process.handover): a new single-process generation loads the
current code and data, and once it serves this one drains and becomes its
supervisor.

It runs the loop every driver runs (forkserve.process.driver), with its own
steps: it reaps only generations (it has no workers), decides on the
copy-on-write check, --reload, the memory log and the hand-over's clock,
and waits on its gevent hub, which serves the requests meanwhile. Its signal
handlers run on the hub (gevent.signal_handler, not in a signal context)
and only enqueue, as in the master; the loop dispatches them. Draining is
not a turn of the loop: the loop ends on a stop or when the hand-over
retires this process, and run() drains the servers, dispatching the signals
that come meanwhile (a HUP during a hand-over's drain makes the supervisor
this process becomes reload again).
"""

import logging
import os

import gevent
import gevent.event

from forkserve.memory import cow, model, render, workergc
from forkserve import exits, logs
from forkserve.process import generation_protocol, procname, signals, source_watch, threads
from forkserve.process.actions import Announce
from forkserve.process.handover import Handover
from forkserve.process.hooks import Hooks
from forkserve.process.unpatched import original
from forkserve.process.driver import Driver
from forkserve.process.generations import Generations
from forkserve.process.gevent_servers import gevent_socket, make_servers
from forkserve.process.signals import SINGLE_SIGNALS
from forkserve.process.stop_state import StopState

__all__ = ["SingleServer"]

log = logging.getLogger("forkserve.error")


class SingleServer(Driver):
    def __init__(self, cfg, app, listeners, app_name, role=generation_protocol.Role(), *,
                 stats_listener=None, hooks=None, waitpid=None):
        self.cfg = cfg
        self.hooks = hooks or Hooks()
        self.app = app
        self.listeners = listeners
        self.app_name = app_name
        self.stats_listener = stats_listener
        self.history = None  # the stats dashboard's, once its server runs
        self.requests = 0
        self.titled = None  # the request count the process title shows
        self.gc = None  # the --worker-gc policy, applied once run() serves
        self.queue = HubSignals()
        self.next_memory_log = 0.0
        self.role = role
        self.generation = role.generation
        self.stop_state = StopState()
        self.handover = Handover(serving=self.generation, owner_serves=True,
                                 graceful_timeout=cfg.graceful_timeout,
                                 stop_state=self.stop_state)
        self.generations = Generations(listeners, fork=threads.unwarned(original("os", "fork")))
        self._waitpid = waitpid or original("os", "waitpid")
        self.clock = _now
        #: a generation's supervisor: when it is gone (SIGKILL), this generation stops
        self.parent = os.getppid() if role.supervised else None

    @property
    def draining(self):
        """The hand-over retired this process (a new generation serves): the
        loop ends, run() drains, then hands over."""
        return self.handover.retiring == self.generation

    def run(self) -> int:
        self.update_title()
        # this process serves as a worker does: it collects its own garbage
        # by the --worker-gc policy (the frozen heap is never examined)
        self.gc = workergc.apply(self.cfg.worker_gc)
        self.queue.install(SINGLE_SIGNALS)  # run on the event loop, not in a signal handler
        signals.release()
        servers = make_servers(self.cfg, self.app, self.listeners, multiprocess=False,
                               on_request=self._count_request, hooks=self.hooks)
        for server in servers:
            server.start()
        stats_server = self._start_stats()
        log.info("Serving from a single process, pid %d (no workers)", os.getpid())
        self.hooks.when_ready(single=self)
        self.apply([Announce()])  # to the supervisor, if this is a generation, and systemd
        self.loop()  # until a stop, or the hand-over retires this process
        if self.stopping == "fast":
            log.info("Shutting down: fast stop")
            for server in servers:
                server.close_now()
        else:
            log.info("%s: draining in-flight requests (up to %gs)",
                     "Handing over" if self.draining else "Shutting down",
                     self.cfg.graceful_timeout)
            self._drain(servers)
        if stats_server is not None:  # it answered /health with 503 while draining
            stats_server.close_now()
        if self.draining:  # a new generation serves: supervise it, unless told to stop
            self.dispatch_signals()  # the last ones: a HUP makes the supervisor reload again
            self.apply(self.handover.gone(self.generation, "drained", _now()))
        self._wait_for_generations()
        return exits.OK

    def _drain(self, servers):
        """Let in-flight requests finish (up to --graceful-timeout), still
        dispatching signals: a HUP during a hand-over's drain is remembered by
        the hand-over, a USR1 reopens the logs, a TERM answers /health 503."""
        drains = [gevent.spawn(server.drain, self.cfg.graceful_timeout) for server in servers]
        for drain in drains:
            drain.link(lambda _: self.queue.wakeup.set())
        while not all(drain.dead for drain in drains):
            self.queue.wait(1.0)  # a signal, or a drain that ended
            self.dispatch_signals()

    def _wait_for_generations(self):
        """Stopping: boot.run leaves no child running. The generations told to
        stop are reaped; the hand-over forces out those that stay."""
        while self.generations.pids:
            self._reap_generations()
            self.apply(self.handover.tick(_now()))
            if self.generations.pids:
                self.queue.wait(0.05)  # SIGCHLD is not watched: poll

    # --- the steps of a turn (driver.Driver.turn) ---

    def finished(self) -> bool:
        """A stop was asked for, or the hand-over retired this process: drain."""
        return bool(self.stopping) or self.draining

    def decide(self):
        cow.check()
        source_watch.poll()
        self.update_title()
        if self.gc is not None:
            self.gc.tick(self.requests)
        self.follow_generations()  # the clock: a generation that loads too long
        interval = self.cfg.memory_log_interval
        now = _now()
        if interval and now >= self.next_memory_log:
            self.next_memory_log = now + interval
            render.log_report(log, self.report())

    def update_title(self):
        """Show the requests served in ps/top, as workers do (if the count
        changed): a supervisor reads them there for the dashboard's rate."""
        if self.titled == self.requests:
            return
        self.titled = self.requests
        procname.set_title(self.cfg, f"generation {self.generation}" if self.role.supervised
                           else "single", self.app_name, f"{self.requests} req")

    def wait(self):
        interval = self.cfg.memory_log_interval
        self.queue.wait(0.1 if self.handover.busy else min(1.0, interval or 1.0))

    def reap(self):
        if self.draining:
            return  # the new generation's exit waits for the drain: the hand-over
            # hears of it after this generation is gone (run())
        self._reap_generations()

    def _reap_generations(self):
        for pid in list(self.generations.pids.values()):
            try:
                reaped, status = self._waitpid(pid, os.WNOHANG)
            except ChildProcessError:  # no longer our child to wait for: it is gone
                description = "is gone (its exit status was collected elsewhere)"
            else:
                if not reaped:
                    continue
                description = exits.classify(status).description
            self.generation_exited(pid, description)

    # --- what the hand-over asks of this process (driver.Driver) ---

    def retire(self, number):
        self.hooks.pre_retire(self.generation)  # self.draining now: the loop ends

    def become_supervisor(self, action):
        generation_protocol.exec_supervisor(self.cfg, self.app_name, self.generations.pid(action.number),
                               action.number, self.listeners, self.stats_listener,
                               reload_again=action.reload_again, history=self.history)

    def serving(self):
        """GET /health on --stats: this process serves and is not stopping."""
        return not self.stopping

    def report(self):
        if self.generations.pids:  # a reload: the tree has a generation under us
            return model.collect(model.discover(os.getpid()))
        return model.collect([model.ProcessInfo(pid=os.getpid(), role="single",
                                                      worker_id=None, requests=self.requests,
                                                      generation=self.generation)])

    def _start_stats(self):
        if self.stats_listener is None:
            return None
        import gevent

        from forkserve.http import stats
        from forkserve.http.server import Server
        from forkserve.memory.history import History

        history = self.history = History()
        server = Server(gevent_socket(self.stats_listener),
                        stats.wsgi_app(self.report, self.serving, history),
                        error_log=logs.error_log, multiprocess=False, worker_connections=16)
        server.start()
        gevent.spawn(stats.sample_forever, history, self.report)
        return server

    # --- signals (forkserve.process.signals), dispatched from the loop ---

    def handle_hup(self):
        if self.role.supervised:
            log.info("Reload signal ignored: this process is a generation; send it to the "
                     "master (the supervisor)")
        else:  # the hand-over remembers one during a reload
            self.apply(self.handover.hup(_now()))

    handle_usr2 = handle_hup

    def handle_usr1(self):
        logs.reopen(self.cfg)

    def handle_ttin(self):
        self._not_here("TTIN")

    def handle_ttou(self):
        self._not_here("TTOU")

    def _not_here(self, name):
        log.info("%s ignored: a single-process server (-w 0) has no workers to change; "
                 "run with -w N to use it", name)

    def _count_request(self):
        self.requests += 1


class HubSignals:
    """The single server's signal queue: gevent runs the handlers on its hub,
    and they only record the signal and wake the loop's wait."""

    def __init__(self):
        self.pending = []
        self.wakeup = gevent.event.Event()

    def install(self, signals):
        for signum in signals:
            gevent.signal_handler(signum, self.push, signum)

    def push(self, signum):
        self.pending.append(signum)
        self.wakeup.set()

    def pop_all(self):
        pending, self.pending = self.pending, []
        return pending

    def wait(self, timeout):
        """Until a signal comes or `timeout` seconds pass (serving meanwhile)."""
        self.wakeup.wait(timeout)
        self.wakeup.clear()


def _now():
    return gevent.get_hub().loop.now()
