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

  FORKSERVE__FDS         listening descriptors to adopt, e.g. "3,4"
  FORKSERVE__READY_FD    where a generation writes b"R" once it serves
  FORKSERVE__GENERATION  the generation's number (1 is the first master)
  FORKSERVE__STATE       the supervisor's state, JSON

They are read once, at the entry point (boot.run, supervisor.main), into a
Role that is passed on; no other module reads them. When to start, retire or
kill a generation is decided in forkserve.process.handover.
"""

import dataclasses
import errno
import json
import logging
import os
import socket
import sys

from forkserve.process import signals, systemd

__all__ = ["Role", "adopted_listeners", "signal_ready", "spawn_generation",
           "exec_supervisor", "supervisor_state"]

FDS, READY_FD, GENERATION, STATE = (
    "FORKSERVE__FDS", "FORKSERVE__READY_FD", "FORKSERVE__GENERATION", "FORKSERVE__STATE")

log = logging.getLogger("forkserve.error")

#: the directory forkserve started in, before --chdir: generations start there
START_DIRECTORY = os.getcwd()


@dataclasses.dataclass(frozen=True)
class Role:
    """How this process was started, read from the environment once, at the entry point.

    generation  1 for the process started by hand or by systemd; N for the
                generation a reload started (it serves under a supervisor)
    ready_fd    a generation's pipe to the process that started it
    fds         listening descriptors to adopt (a parent's, or systemd's)
    """
    generation: int = 1
    ready_fd: int | None = None
    fds: tuple | None = None

    @property
    def supervised(self) -> bool:
        """A generation started by a reload: its parent holds the pid file and stats."""
        return self.ready_fd is not None

    @classmethod
    def from_environ(cls, environ=os.environ):
        """Take the protocol's variables out of `environ` (the application and
        its children never see them) and systemd's socket activation ones."""
        fds = environ.pop(FDS, None)
        ready_fd = environ.pop(READY_FD, None)
        generation = int(environ.pop(GENERATION, "1"))
        adopted = systemd.listen_fds(environ, os.getpid())
        if fds:
            adopted = tuple(int(fd) for fd in fds.split(","))
        if ready_fd is not None:
            ready_fd = int(ready_fd)
            try:  # the application's own subprocesses never hold the ready pipe
                os.set_inheritable(ready_fd, False)
            except OSError as exc:
                if exc.errno != errno.EBADF:
                    raise
                # not open: signal_ready() reports it when it writes
        return cls(generation=generation, fds=adopted, ready_fd=ready_fd)


def adopted_listeners(role):
    """The listening sockets handed over by a parent forkserve or by systemd, or None."""
    if role.fds is None:
        return None
    listeners = []
    for fd in role.fds:
        sock = socket.socket(fileno=fd)
        sock.set_inheritable(True)
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            # systemd's sockets come without it; Nagle + delayed ACK cost ~40 ms.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        listeners.append(sock)
    return listeners


def signal_ready(role):
    """Tell the parent this generation serves. Harmless when there is no parent."""
    if role.ready_fd is None:
        return
    try:
        os.write(role.ready_fd, b"R")
        os.close(role.ready_fd)
    except OSError as exc:
        log.warning("could not report readiness to the master: %s", exc.strerror)


def spawn_generation(listeners, number, argv=None, fork=os.fork, directory=None):
    """fork + exec a new generation that adopts `listeners`: (pid, ready read end).

    It starts in `directory`, by default the one forkserve started in.
    """
    argv = list(argv or sys.orig_argv)
    read_end, write_end = os.pipe()
    environ = dict(os.environ)
    environ.update({GENERATION: str(number), READY_FD: str(write_end),
                    FDS: ",".join(str(sock.fileno()) for sock in listeners)})
    # Only the process systemd started (this one, later the supervisor: same
    # PID) talks to systemd; a generation has nothing to tell it.
    environ.pop(systemd.NOTIFY_SOCKET, None)
    try:
        pid = fork()
    except OSError:
        os.close(read_end)
        os.close(write_end)
        raise
    if pid == 0:
        try:
            os.chdir(directory or START_DIRECTORY)
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


def supervisor_state(environ=os.environ):
    """What exec_supervisor() handed to the supervisor, taken out of `environ`."""
    return json.loads(environ.pop(STATE))


def exec_supervisor(cfg, app_name, child_pid, number, listeners, stats_listener=None, *,
                    reload_again=False, queue=None, history=None, workers=0):
    """Replace this process with the supervisor of generation `number`. Never returns.

    From here on signals stay blocked (the mask and pending signals survive
    exec; the supervisor unblocks them once its handlers are in), and the
    ones already in `queue` (a SignalQueue) are handed over in the state.
    The stats dashboard's `history` (forkserve.memory.history.History), if
    any, goes along in a memfd (`taken_history()` reads it back). `workers`
    TTIN (negative: TTOU) are still to be forwarded to generation `number`.
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
             "history_fd": _history_fd(history) if history is not None else None,
             "argv": list(sys.orig_argv), "start_directory": START_DIRECTORY,
             "reload_again": reload_again, "signals": [int(signum) for signum in handed_over],
             "workers": workers}
    environ = dict(os.environ)
    environ[STATE] = json.dumps(state)
    for name in (FDS, READY_FD, GENERATION):
        environ.pop(name, None)
    log.info("Generation %d serves; the master continues as its supervisor (pid %d)",
             number, os.getpid())
    systemd.notify("READY=1")  # the reload is done; signals are held, none is lost
    for handler in logging.getLogger("forkserve.error").handlers:
        handler.flush()
    os.execve(sys.executable, [sys.executable, "-m", "forkserve.process.supervisor"], environ)


def _history_fd(history):
    """An inheritable memfd holding the history as JSON; None (and a
    warning: the dashboard starts again) if it cannot be written."""
    try:
        fd = os.memfd_create("forkserve-history", 0)  # not MFD_CLOEXEC: it crosses the exec
    except (AttributeError, OSError) as exc:
        log.warning("The stats dashboard's history starts again after this reload: "
                    "no memfd to hand it over (%s)", exc)
        return None
    with os.fdopen(os.dup(fd), "w", closefd=True) as out:
        json.dump(history.dump(), out, separators=(",", ":"))
    return fd


def taken_history(state):
    """The History exec_supervisor() handed over in `state`, or None; its
    memfd is closed either way."""
    from forkserve.memory.history import History

    fd = state.get("history_fd")
    if fd is None:
        return None
    try:
        with os.fdopen(fd, "r", closefd=True) as source:
            source.seek(0)
            return History.load(json.load(source))
    except (OSError, ValueError) as exc:
        log.warning("The stats dashboard's history starts again: the one handed over "
                    "could not be read (%s)", exc)
        return None
