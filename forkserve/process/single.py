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
and waits through gevent's select(), so that its hub serves the requests
meanwhile (and the stats endpoint is served from that wait, as in the
master). Its signal handlers run on the hub (gevent.signal_handler, not in
a signal context) and only enqueue, as in the master; the loop dispatches
them. The loop ends on a stop or when the hand-over retires this process;
then the driver's drain lets in-flight requests finish, dispatching the
signals that come meanwhile (a HUP during a hand-over's drain makes the
supervisor this process becomes reload again).
"""

import logging
import os

import gevent
import gevent.select

from forkserve.memory import cow, model, workergc
from forkserve import exits, logs
from forkserve.process import generation_protocol, procname, signals, source_watch, threads
from forkserve.process.actions import Announce
from forkserve.process.handover import Handover
from forkserve.process.hooks import Hooks
from forkserve.process.unpatched import original
from forkserve.process.driver import Driver
from forkserve.process.generations import Generations
from forkserve.process.gevent_servers import cpu_turns_for, make_servers, outbox_for
from forkserve.process.signals import SINGLE_SIGNALS, SignalQueue
from forkserve.process.stop_state import StopState

__all__ = ["SingleServer"]

log = logging.getLogger("forkserve.error")


class SingleServer(Driver):
    def __init__(self, cfg, app, listeners, app_name, role=generation_protocol.Role(), *,
                 stats=None, hooks=None, waitpid=None, clock=None):
        self.cfg = cfg
        self.hooks = hooks or Hooks()
        self.app = app
        self.listeners = listeners
        self.app_name = app_name
        self.stats = stats  # a forkserve.http.stats.StatsEndpoint, served from wait()
        self.requests = 0
        self.title = procname.Title(cfg, f"generation {role.generation}" if role.supervised
                                    else "single", app_name)
        self.gc = None  # the --worker-gc policy, applied once run() serves
        self.queue = SignalQueue()
        self.role = role
        self.generation = role.generation
        self.stop_state = StopState()
        self.handover = Handover(serving=self.generation, owner_serves=True,
                                 graceful_timeout=cfg.graceful_timeout,
                                 stop_state=self.stop_state)
        self.generations = Generations(listeners, fork=threads.unwarned(original("os", "fork")))
        self._waitpid = waitpid or original("os", "waitpid")
        self._select = gevent.select.select  # the hub serves while the loop waits
        self.clock = clock or _now  # the hub's clock, unless a test injects one
        #: a generation's supervisor: when it is gone (SIGKILL), this generation stops
        self.parent = os.getppid() if role.supervised else None

    def run(self) -> int:
        self.update_title()
        # this process serves as a worker does: it collects its own garbage
        # by the --worker-gc policy (the frozen heap is never examined)
        self.gc = workergc.apply(self.cfg.worker_gc)
        outbox = outbox_for(self.cfg)  # None with --no-batch-responses
        # takes turns on the CPU with other processes, as a worker does
        self.cpu_turns = cpu_turns_for(self.cfg, outbox)
        # run on the event loop, not in a signal handler
        self.queue.install(SINGLE_SIGNALS, setter=signals.on_hub)
        signals.release()
        servers = make_servers(self.cfg, self.app, self.listeners, multiprocess=False,
                               on_request=self._count_request, hooks=self.hooks,
                               outbox=outbox)
        for server in servers:
            server.start()
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
            self.drain(servers)  # the stats endpoint answers /health 503 meanwhile
        if self.draining:  # a new generation serves: supervise it, unless told to stop
            self.dispatch_signals()  # the last ones: a HUP makes the supervisor reload again
            self.apply(self.handover.gone(self.generation, "drained", self.clock()))
        # stopping: boot.run leaves no child running; the hand-over forces out
        # the generations that stay
        self.reap_until(lambda: not self.generations.pids)
        return exits.OK

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
        self.log_memory()

    def update_title(self):
        """Show the requests served in ps/top, as workers do (if the count
        changed): a supervisor reads them there for the dashboard's rate."""
        self.title.show(f"{self.requests} req")

    def next_turn_in(self):
        interval = self.cfg.memory_log_interval
        return 0.1 if self.handover.busy else min(1.0, interval or 1.0)

    def reap(self):
        if self.draining:
            return  # the new generation's exit waits for the drain: the hand-over
            # hears of it after this generation is gone (run())
        super().reap()

    def exited_children(self):
        """Only the generations' exits, pid by pid: a child the application
        started is the application's to wait for."""
        for pid in list(self.generations.pids.values()):
            try:
                reaped, status = self._waitpid(pid, os.WNOHANG)
            except ChildProcessError:  # no longer our child to wait for: it is gone
                yield pid, exits.Exit("gone", description="is gone (its exit status was "
                                                          "collected elsewhere)")
                continue
            if reaped:
                yield pid, exits.classify(status)

    # --- what the hand-over asks of this process (driver.Driver) ---

    def retire(self, number):
        self.hooks.pre_retire(self.generation)  # self.draining now: the loop ends

    def serving(self):
        """GET /health on --stats: this process serves and is not stopping."""
        return not self.stopping

    def process_infos(self):
        return [model.ProcessInfo(pid=os.getpid(), role="single", worker_id=None,
                                  requests=self.requests, generation=self.generation)]

    # --- signals (forkserve.process.signals), dispatched from the loop ---

    def handle_hup(self):
        if self.role.supervised:
            log.info("Reload signal ignored: this process is a generation; send it to the "
                     "master (the supervisor)")
        else:  # the hand-over remembers one during a reload
            self.apply(self.handover.hup(self.clock()))

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


def _now():
    return gevent.get_hub().loop.now()
