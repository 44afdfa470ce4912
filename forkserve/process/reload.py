"""Reloading code and data with no dropped request and no PID change.

On HUP the master starts a *generation*: a fresh `python` running the
original command line (so the current code and dataset load in a new
interpreter), told through the environment to adopt the master's listening
sockets instead of binding. The generation loads, forks its workers and
writes one byte to a pipe once they accept. Only then are the old workers
drained. If the generation dies first (an import error, bad data), it never
wrote the byte: the old workers keep serving and the error is in the log.

When the old workers are gone the master exec()s itself into the
supervisor (forkserve.process.supervisor): same PID, so the pid file, systemd and
`kill -HUP` keep working, but a fresh small interpreter, so the old
generation's heap — immortal shared objects included — is released by the
exec, not leaked. Peak memory during a hand-over is old + new. Later reloads
are the supervisor starting generation N+1 and stopping generation N.

The protocol between these processes is a handful of environment variables
(names with a double underscore, so no setting can collide with them):

  FORKSERVE__ROLE        "generation" or "supervisor"
  FORKSERVE__FDS         listening descriptors to adopt, e.g. "3,4"
  FORKSERVE__READY_FD    where a generation writes b"R" once it serves
  FORKSERVE__GENERATION  the generation's number (1 is the first master)
  FORKSERVE__STATE       the supervisor's state, JSON
"""

import json
import logging
import os
import signal
import socket
import sys

from forkserve import exits
from forkserve.process import handover, signals, systemd

__all__ = ["role", "generation_number", "adopted_listeners", "signal_ready",
           "spawn_generation", "exec_supervisor", "Generations", "Driver"]

ROLE, FDS, READY_FD, GENERATION, STATE = (
    "FORKSERVE__ROLE", "FORKSERVE__FDS", "FORKSERVE__READY_FD", "FORKSERVE__GENERATION",
    "FORKSERVE__STATE")

log = logging.getLogger("forkserve.error")

#: the directory forkserve started in, before --chdir: generations start there
START_DIRECTORY = os.getcwd()


def role(environ=os.environ):
    return environ.get(ROLE)


def generation_number(environ=os.environ) -> int:
    return int(environ.get(GENERATION, "1"))


def adopted_listeners(environ=os.environ):
    """Listening sockets handed over by a parent forkserve or by systemd, or None."""
    if environ.get(FDS):
        fds = [int(fd) for fd in environ[FDS].split(",")]
    elif environ.get("LISTEN_FDS") and environ.get("LISTEN_PID") == str(os.getpid()):
        fds = list(range(3, 3 + int(environ["LISTEN_FDS"])))  # systemd socket activation
    else:
        return None
    for name in (FDS, "LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES"):
        os.environ.pop(name, None)  # not for processes the application starts
    listeners = []
    for fd in fds:
        sock = socket.socket(fileno=fd)
        sock.set_inheritable(True)
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            # systemd's sockets come without it; Nagle + delayed ACK cost ~40 ms.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        listeners.append(sock)
    return listeners


def signal_ready(environ=os.environ):
    """Tell the parent this generation serves. Harmless when there is no parent."""
    fd = environ.pop(READY_FD, None)
    if fd is None:
        return
    os.environ.pop(READY_FD, None)
    try:
        os.write(int(fd), b"R")
        os.close(int(fd))
    except OSError as exc:
        log.warning("could not report readiness to the master: %s", exc.strerror)


class Generations:
    """The generation processes this process started: spawn, ready, signal, reap.

    The I/O half of a reload; forkserve.process.handover decides. Generations
    are known by number; `fork` and `kill` can be injected for tests.
    """

    def __init__(self, listeners, argv=None, *, fork=os.fork, kill=os.kill):
        self.listeners = listeners
        self.argv = argv
        self._fork = fork
        self._kill = kill
        self.pids = {}        # number -> pid, until reaped
        self.ready_fds = {}   # number -> read end of its ready pipe, until it is ready

    def spawn(self, number):
        pid, ready_fd = spawn_generation(self.listeners, number, self.argv, fork=self._fork)
        self.pids[number] = pid
        self.ready_fds[number] = ready_fd

    def waiting_fds(self):
        """Descriptors that become readable when a starting generation is ready."""
        return list(self.ready_fds.values())

    def newly_ready(self):
        """Numbers of the generations that wrote their ready byte (never blocks)."""
        ready = []
        for number, fd in list(self.ready_fds.items()):
            try:
                byte = os.read(fd, 1)
            except BlockingIOError:
                continue
            if byte == b"R":
                ready.append(number)
            self._close(number)  # ready, or EOF: the generation died (reaped later)
        return ready

    def signal(self, number, signum):
        pid = self.pids.get(number)
        if pid is None:
            return
        try:
            self._kill(pid, signum)
        except ProcessLookupError:
            pass  # exited; the reaper collects it

    def exited(self, pid):
        """The number of generation `pid`, forgotten now; None if it is not one."""
        for number, known in list(self.pids.items()):
            if known == pid:
                del self.pids[number]
                self._close(number)
                return number
        return None

    def pid(self, number):
        return self.pids.get(number)

    def _close(self, number):
        fd = self.ready_fds.pop(number, None)
        if fd is not None:
            os.close(fd)


class Driver:
    """Carries out forkserve.process.handover's actions: the part every driver shares.

    A driver (master, single server, supervisor) has `self.handover`,
    `self.generations` (a Generations) and its own `retire(number)` and
    `kill_generation(number)`; the master and the single server also
    `become_supervisor(action)`.
    """

    def apply(self, actions):
        for action in actions:
            getattr(self, _ACTIONS[type(action)])(action)

    def _do_spawn(self, action):
        self.generations.spawn(action.number)

    def _do_retire(self, action):
        self.retire(action.number)

    def _do_kill(self, action):
        self.kill_generation(action.number)

    def _do_stop(self, action):
        self.generations.signal(action.number,
                                signal.SIGTERM if action.mode == "graceful" else signal.SIGQUIT)

    def _do_notify(self, action):
        systemd.notify(action.state)

    def _do_log(self, action):
        log.log(action.level, "%s", action.message)

    def _do_become_supervisor(self, action):
        self.become_supervisor(action)

    def _do_halt(self, action):
        raise exits.HaltServer(action.reason, exits.WORKER_BOOT_ERROR)


_ACTIONS = {handover.Spawn: "_do_spawn", handover.Retire: "_do_retire",
            handover.Kill: "_do_kill", handover.Stop: "_do_stop",
            handover.Notify: "_do_notify", handover.Log: "_do_log",
            handover.BecomeSupervisor: "_do_become_supervisor", handover.Halt: "_do_halt"}


def spawn_generation(listeners, number, argv=None, fork=os.fork):
    """fork + exec a new generation that adopts `listeners`: (pid, ready read end)."""
    argv = list(argv or sys.orig_argv)
    read_end, write_end = os.pipe()
    environ = dict(os.environ)
    environ.update({ROLE: "generation", GENERATION: str(number), READY_FD: str(write_end),
                    FDS: ",".join(str(sock.fileno()) for sock in listeners)})
    pid = fork()
    if pid == 0:
        try:
            os.chdir(START_DIRECTORY)
            os.set_inheritable(write_end, True)
            for sock in listeners:
                sock.set_inheritable(True)
            signals.release()
            os.execve(sys.executable, argv, environ)
        finally:
            os._exit(127)
    os.close(write_end)
    os.set_blocking(read_end, False)
    log.info("Reloading: started generation %d (pid %d)", number, pid)
    return pid, read_end


def exec_supervisor(cfg, app_name, child_pid, number, listeners, stats_listener=None, *,
                    reload_again=False, queue=None):
    """Replace this process with the supervisor of generation `number`. Never returns.

    From here on signals stay blocked (the mask and pending signals survive
    exec; the supervisor unblocks them once its handlers are in), and the
    ones already in `queue` (a SignalQueue) are handed over in the state.
    """
    signals.hold()
    handed_over = queue.pop_all() if queue is not None else []
    fds = [sock.fileno() for sock in listeners]
    for sock in listeners:
        sock.set_inheritable(True)
    stats_fd = None
    if stats_listener is not None:
        stats_listener.set_inheritable(True)
        stats_fd = stats_listener.fileno()
    state = {"values": cfg.values, "app": cfg.app, "app_name": app_name, "child": child_pid,
             "generation": number, "fds": fds, "stats_fd": stats_fd,
             "argv": list(sys.orig_argv), "start_directory": START_DIRECTORY,
             "reload_again": reload_again, "signals": [int(signum) for signum in handed_over]}
    environ = dict(os.environ)
    environ[STATE] = json.dumps(state)
    environ[ROLE] = "supervisor"
    for name in (FDS, READY_FD, GENERATION):
        environ.pop(name, None)
    log.info("Generation %d serves; the master continues as its supervisor (pid %d)",
             number, os.getpid())
    systemd.notify("READY=1")  # the reload is done; signals are held, none is lost
    for handler in logging.getLogger("forkserve.error").handlers:
        handler.flush()
    os.execve(sys.executable, [sys.executable, "-m", "forkserve.process.supervisor"], environ)
