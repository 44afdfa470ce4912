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
import socket
import sys

from forkserve.process import signals, systemd

__all__ = ["role", "generation_number", "adopted_listeners", "signal_ready",
           "spawn_generation", "exec_supervisor", "PendingGeneration"]

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


class PendingGeneration:
    """A generation that was started and has not yet said it serves."""

    def __init__(self, pid, ready_fd, number):
        self.pid = pid
        self.ready_fd = ready_fd
        self.number = number

    def ready(self) -> bool:
        """True once the generation wrote its byte (reads without blocking)."""
        try:
            return os.read(self.ready_fd, 1) == b"R"
        except BlockingIOError:
            return False

    def close(self):
        if self.ready_fd is not None:
            os.close(self.ready_fd)
            self.ready_fd = None


def spawn_generation(listeners, number, argv=None, fork=os.fork) -> PendingGeneration:
    """fork + exec a new generation that adopts `listeners`."""
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
    return PendingGeneration(pid, read_end, number)


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
    systemd.notify("READY=1")  # the reload is done: the new generation serves
    for handler in logging.getLogger("forkserve.error").handlers:
        handler.flush()
    os.execve(sys.executable, [sys.executable, "-m", "forkserve.process.supervisor"], environ)
