"""The supervisor: what the master becomes after its first reload.

It holds the listening sockets, the pid file and the stats endpoint, loads
no application, and supervises generations (see forkserve.process.reload): one
serving, and during a reload a second one starting. Run as
`python -m forkserve.process.supervisor` by reload.exec_supervisor(), never by hand.

    HUP         start generation N+1; once it serves, TERM generation N
    TERM        TERM every generation (each drains), then exit 0
    INT, QUIT   QUIT every generation, then exit 0
    TTIN, TTOU  passed to the serving generation
    USR1        reopen own logs, pass to every generation

A serving generation that dies is replaced by a new one; five that fail to
start in a row with none serving stop the supervisor (status 3).
"""

import json
import logging
import os
import signal
import sys

from forkserve.memory import cow, model, reporter
from forkserve import exits, logs
from forkserve.process import procname, reload, signals, systemd
from forkserve.process.master import _original
from forkserve.config.settings import Config
from forkserve.process.signals import MASTER_SIGNALS, SignalQueue, handler_name

__all__ = ["Supervisor"]

log = logging.getLogger("forkserve.error")


class Supervisor:
    #: failed generation starts in a row (with none serving) before giving up
    max_failures = 5

    def __init__(self, state):
        self.cfg = Config(app=state["app"], values=state["values"])
        self.app_name = state["app_name"]
        self.argv = state["argv"]
        reload.START_DIRECTORY = state["start_directory"]
        import socket
        self.listeners = [socket.socket(fileno=fd) for fd in state["fds"]]
        self.stats = None
        if state["stats_fd"] is not None:
            from forkserve.http.stats import StatsEndpoint
            stats_sock = socket.socket(fileno=state["stats_fd"])
            stats_sock.set_inheritable(False)
            self.stats = StatsEndpoint(stats_sock)
        self.serving = state["child"]
        self.number = state["generation"]
        self.generations = {self.serving: self.number}   # pid -> number, incl. draining ones
        self.pending = None
        #: a HUP that came while a reload was under way, done once it is over
        self.reload_again = state.get("reload_again", False)
        self.failures = 0
        self.stopping = False
        self.queue = SignalQueue()
        for signum in state.get("signals", ()):
            self.queue.push(signum)  # arrived while the master was handing over
        self._select = _original("select", "select")

    def run(self) -> int:
        self.set_title()
        self.queue.install(MASTER_SIGNALS)
        signals.release()
        try:
            while True:
                for signum in self.queue.pop_all():
                    getattr(self, handler_name(signum))()
                self.reap()
                if self.stopping and not self.generations:
                    break
                if self.pending is not None and self.pending.ready():
                    self.promote()
                if self.pending is None and not self.stopping and (
                        self.serving is None or self.reload_again):
                    self.reload_again = False
                    self.start_generation()
                self.sleep()
        except exits.HaltServer as halt:
            log.error("Shutting down: %s", halt.reason)
            self.signal_all(signal.SIGQUIT)
            return halt.status
        log.info("Shutting down: master")
        return exits.OK

    def sleep(self):
        watched = [self.queue.wake_r]
        if self.pending is not None:
            watched.append(self.pending.ready_fd)
        stats_r = self.stats.filenos() if self.stats else []
        stats_w = self.stats.writable_filenos() if self.stats else []
        readable, writable, _ = self._select(watched + stats_r, stats_w, [], 1.0)
        if self.queue.wake_r in readable:
            self.queue.drain_wakeups()
        if self.stats:
            self.stats.service(readable, writable, self.report)

    # --- generations ---

    def start_generation(self):
        number = self.number + 1
        self.pending = reload.spawn_generation(self.listeners, number, self.argv,
                                               fork=_original("os", "fork"))
        self.generations[self.pending.pid] = number
        self.number = number

    def promote(self):
        old, new = self.serving, self.pending
        self.pending.close()
        self.pending = None
        self.serving = new.pid
        self.failures = 0
        self.set_title()
        log.info("Generation %d (pid %d) serves", new.number, new.pid)
        systemd.notify("READY=1")
        if old is not None:
            log.info("Draining generation %d (pid %d)", self.generations.get(old, 0), old)
            self._kill(old, signal.SIGTERM)

    def reap(self):
        while True:
            try:
                pid, status = _original("os", "waitpid")(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            number = self.generations.pop(pid, None)
            if number is None:
                continue  # a worker of the generation this process used to be
            outcome = exits.classify(status)
            if self.pending is not None and pid == self.pending.pid:
                self.pending.close()
                self.pending = None
                self.failures += 1
                log.error("Reload failed: generation %d (pid %d) %s before it was ready; %s",
                          number, pid, outcome.description,
                          "the previous generation keeps serving" if self.serving
                          else "retrying")
                if self.serving is None and self.failures >= self.max_failures:
                    raise exits.HaltServer("no generation could start; see the errors above",
                                           exits.WORKER_BOOT_ERROR)
            elif pid == self.serving:
                self.serving = None
                if not self.stopping:
                    log.error("Generation %d (pid %d) %s; starting a new one", number, pid,
                              outcome.description)
            else:
                log.info("Generation %d (pid %d) %s", number, pid, outcome.description)

    # --- signals, dispatched from the loop ---

    def handle_hup(self):
        if self.stopping:
            return
        if self.pending is not None:
            log.info("Hang up while generation %d starts: reloading again once it serves",
                     self.pending.number)
            self.reload_again = True
            return
        log.info("Hang up: reloading")
        systemd.notify("RELOADING=1")
        self.start_generation()

    def handle_term(self):
        self.stopping = True
        systemd.notify("STOPPING=1")
        log.info("Handling signal: term (graceful stop)")
        self.signal_all(signal.SIGTERM)

    def handle_int(self):
        self.stopping = True
        systemd.notify("STOPPING=1")
        log.info("Handling signal: fast stop")
        self.signal_all(signal.SIGQUIT)

    handle_quit = handle_int

    def handle_ttin(self):
        self._forward(signal.SIGTTIN)

    def handle_ttou(self):
        self._forward(signal.SIGTTOU)

    def handle_usr1(self):
        logs.reopen()
        self.signal_all(signal.SIGUSR1)

    def handle_chld(self):
        pass  # reap() runs every turn

    def _forward(self, signum):
        if self.serving is not None:
            self._kill(self.serving, signum)

    def signal_all(self, signum):
        for pid in list(self.generations):
            self._kill(pid, signum)

    def _kill(self, pid, signum):
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass  # exited; reap() collects it

    # --- memory ---

    def set_title(self):
        """'forkserve: supervisor [app] serving generation 3': `forkserve memory
        --pid` reads which generation serves from it."""
        number = self.generations.get(self.serving)
        procname.set_title(self.cfg, "supervisor", self.app_name,
                           f"serving generation {number}" if number else "")

    def report(self):
        pending = self.pending.pid if self.pending is not None else None
        generations = [(pid, number, "serving" if pid == self.serving else
                        "starting" if pid == pending else "draining")
                       for pid, number in self.generations.items()]
        return reporter.collect(model.supervised_infos(os.getpid(), generations))


def main():
    state = json.loads(os.environ.pop(reload.STATE))
    os.environ.pop(reload.ROLE, None)
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
