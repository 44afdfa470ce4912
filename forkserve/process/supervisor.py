"""The supervisor: what the master becomes after its first reload.

It holds the listening sockets, the pid file and the stats endpoint, loads
no application, and supervises generations (see forkserve.process.generation_protocol): one
serving, and during a reload a second one starting. Run as
`python -m forkserve.process.supervisor` by generation_protocol.exec_supervisor(), never by hand.

The hand-over decisions are forkserve.process.handover's (as in the master
and the single server); this module carries them out, in the loop every
driver runs (forkserve.process.driver). What each signal does
here is declared in forkserve.process.signals.

A serving generation that dies is replaced by a new one; five that fail to
start in a row with none serving stop the supervisor (status 3).
"""

import logging
import os
import signal
import socket
import sys
import time

from forkserve.memory import cow, model
from forkserve import logs
from forkserve.process import generation_protocol, procname, signals, systemd, threads
from forkserve.config.settings import Config
from forkserve.process.driver import Driver
from forkserve.process.generations import Generations
from forkserve.process.handover import Handover
from forkserve.process.hooks import Hooks
from forkserve.process.signals import MASTER_SIGNALS, SignalQueue
from forkserve.process.stop_state import StopState
from forkserve.process.unpatched import original

__all__ = ["Supervisor"]

log = logging.getLogger("forkserve.error")


class Supervisor(Driver):
    #: failed generation starts in a row (with none serving) before giving up
    max_failures = 5

    def __init__(self, state, *, fork=None, waitpid=None, kill=os.kill, select=None,
                 clock=time.monotonic):
        self.cfg = Config(app=state["app"], values=state["values"])
        self.hooks = Hooks()  # a config file's hooks run in the generations, not here
        self.app_name = state["app_name"]
        self.listeners = [socket.socket(fileno=fd) for fd in state["fds"]]
        self.stats = None
        if state["stats_fd"] is not None:
            from forkserve.http.stats import StatsEndpoint
            stats_sock = socket.socket(fileno=state["stats_fd"])
            stats_sock.set_inheritable(False)
            self.stats = StatsEndpoint(stats_sock, generation_protocol.taken_history(state))
        self._waitpid = waitpid or original("os", "waitpid")
        self._select = select or original("select", "select")
        self.clock = clock
        self.generations = Generations(self.listeners, state["argv"],
                                       fork=threads.unwarned(fork or original("os", "fork")),
                                       kill=kill, directory=state["start_directory"])
        self.generations.pids[state["generation"]] = state["child"]
        self.stop_state = StopState()
        self.handover = Handover(serving=state["generation"], owner_serves=False,
                                 graceful_timeout=self.cfg.graceful_timeout,
                                 max_failures=self.max_failures,
                                 reload_again=state.get("reload_again", False),
                                 workers=state.get("workers", 0), stop_state=self.stop_state)
        self.title = procname.Title(self.cfg, "supervisor", self.app_name)
        self.queue = SignalQueue()
        for signum in state.get("signals", ()):
            self.queue.push(signum)  # arrived while the master was handing over

    def run(self) -> int:
        self.show_title()
        self.queue.install(MASTER_SIGNALS)
        signals.release()
        return self.serve()

    def begin(self):
        self.apply(self.handover.begin(self.clock()))

    # --- the steps of a turn (driver.Driver.turn) ---

    def finished(self) -> bool:
        """Stopped, with no generation left."""
        return bool(self.stopping) and not self.generations.pids

    def decide(self):
        self.follow_generations()
        self.show_title()

    def next_turn_in(self):
        return 1.0

    # --- what the hand-over asks (driver.Driver) ---

    def retire(self, number):
        self.generations.signal(number, signal.SIGTERM)

    # --- signals, dispatched from the loop ---

    def handle_hup(self):
        self.apply(self.handover.hup(self.clock()))

    handle_usr2 = handle_hup

    def stop_own(self, mode, now):
        systemd.notify("STOPPING=1")
        log.info("Handling signal: term (graceful stop)" if mode == "graceful"
                 else "Handling signal: fast stop")

    def handle_usr1(self):
        logs.reopen(self.cfg)
        self.signal_all(signal.SIGUSR1)

    def signal_all(self, signum):
        for number in list(self.generations.pids):
            self.generations.signal(number, signum)

    # --- memory ---

    def show_title(self):
        """'forkserve: supervisor [app] serving generation 3': `forkserve memory
        --pid` reads which generation serves from it."""
        number = self.handover.serving
        self.title.show(f"serving generation {number}" if number else "")

    def serving(self):
        """GET /health on --stats: a generation serves and no stop is under way."""
        return self.handover.serving is not None and not self.stopping

    def process_infos(self):
        handover = self.handover
        generations = [(pid, number, "serving" if number == handover.serving else
                        "starting" if number == handover.starting else "draining")
                       for number, pid in self.generations.pids.items()]
        return model.supervised_infos(os.getpid(), generations)


def main():
    state = generation_protocol.supervisor_state()
    supervisor = Supervisor(state)
    logs.setup(supervisor.cfg)
    cow.begin_load()
    status = supervisor.run()
    from forkserve.process import boot, sockets
    sockets.close_all(supervisor.listeners)
    if supervisor.cfg.pid:
        boot.remove_pidfile(supervisor.cfg.pid)
    cow.exit_process(status)


if __name__ == "__main__":
    main()
    sys.exit(1)  # main() never returns
