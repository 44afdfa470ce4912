"""The I/O half of a reload: the generation processes a driver started
(spawn, ready byte, signal, reap). forkserve.process.driver carries out the
hand-over's actions with it.
"""

import logging
import os
import signal

from forkserve.memory import procfs
from forkserve.process.generation_protocol import spawn_generation

__all__ = ["Generations", "reaped"]

log = logging.getLogger("forkserve.error")


def reaped(waitpid):
    """(pid, status) of each child that has exited, without blocking."""
    while True:
        try:
            pid, status = waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return  # no children at all
        if pid == 0:
            return
        yield pid, status


class Generations:
    """The generation processes this process started: spawn, ready, signal, reap.

    The I/O half of a reload; forkserve.process.handover decides. Generations
    are known by number; `fork`, `kill` and `children` (a process's child
    pids) can be injected for tests. They start in `directory` (default: the
    one this process started in).
    """

    def __init__(self, listeners, argv=None, *, fork=os.fork, kill=os.kill, directory=None,
                 children=procfs.child_pids):
        self.listeners = listeners
        self.argv = argv
        self.directory = directory
        self._fork = fork
        self._kill = kill
        self._children = children
        self.pids = {}        # number -> pid, until reaped
        self.ready_fds = {}   # number -> read end of its ready pipe, until it is ready

    def spawn(self, number):
        pid, ready_fd = spawn_generation(self.listeners, number, self.argv, fork=self._fork,
                                         directory=self.directory)
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

    def force_out(self, number, hard=False):
        """SIGQUIT (its master kills its own workers) or, `hard`, SIGKILL to it
        and to its workers (which may be as blocked as their master), saying
        which in the log."""
        pid = self.pids.get(number)
        if pid is None:
            return
        if not hard:
            log.warning("Sending SIGQUIT to generation %d (pid %d)", number, pid)
            self.signal(number, signal.SIGQUIT)
            return
        workers = self._children(pid)  # read first: once it dies they are init's
        log.warning("Sending SIGKILL to generation %d (pid %d) and its %d workers",
                    number, pid, len(workers))
        self.signal(number, signal.SIGKILL)
        for worker in workers:
            try:
                self._kill(worker, signal.SIGKILL)
            except ProcessLookupError:
                pass  # gone already

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
