"""The I/O half of a reload: the generation processes a driver started, and
the actions of forkserve.process.handover carried out.

The master, the single-process server and the supervisor each are a Driver:
they feed the hand-over events and `apply()` the actions it returns.
"""

import errno
import logging
import os
import signal

from forkserve import exits
from forkserve.memory import procfs
from forkserve.process import handover, systemd
from forkserve.process.reload import spawn_generation

__all__ = ["Generations", "Driver"]

log = logging.getLogger("forkserve.error")

#: what fork() raises when the system is out of processes or memory
FORK_ERRNOS = {errno.EAGAIN, errno.ENOMEM}


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


class Driver:
    """Carries out forkserve.process.handover's actions, and feeds it what
    happened to the generations: the part every driver shares.

    A driver (master, single server, supervisor) has `self.handover`, `self.clock()`,
    `self.hooks` (a forkserve.process.hooks.Hooks),
    `self.generations` (a Generations) and its own `retire(number)`; the
    master also `kill_own_workers()`; the master and the single server also
    `become_supervisor(action)`.
    """

    #: a generation's supervisor (its pid): once it is gone (SIGKILL), this
    #: generation stops; None when this process is not a supervised generation
    parent = None

    def apply(self, actions):
        for action in actions:
            getattr(self, _ACTIONS[type(action)])(action)

    def follow_generations(self):
        """The starting generations' ready bytes and the clock, to the hand-over."""
        now = self.clock()
        for _ in self.generations.newly_ready():
            self.apply(self.handover.ready(now))
        self.apply(self.handover.tick(now))

    def generation_exited(self, pid, description):
        """A reaped child: if it was a generation, the hand-over hears of it
        (True); False for any other child."""
        number = self.generations.exited(pid)
        if number is None:
            return False
        self.apply(self.handover.gone(number, f"(pid {pid}) {description}", self.clock()))
        return True

    def supervisor_gone(self) -> bool:
        """True, once and logged, when this generation's supervisor has died."""
        if self.parent is None or os.getppid() == self.parent:
            return False
        log.warning("The supervisor (pid %d) is gone; stopping", self.parent)
        self.parent = None
        return True

    def _do_spawn(self, action):
        self.hooks.on_reload()   # Gunicorn's reload hooks, where a config installed them
        self.hooks.pre_exec()
        try:
            self.generations.spawn(action.number)
        except OSError as exc:
            if exc.errno not in FORK_ERRNOS:
                raise
            # a failed start, as if it had died loading: the serving one goes on
            self.apply(self.handover.gone(
                action.number, f"could not be started (fork: {exc.strerror}; free "
                               "memory or raise the process limit)", self.clock()))

    def _do_retire(self, action):
        self.retire(action.number)

    def _do_kill(self, action):
        if action.number == self.handover.owner:
            self.kill_own_workers()  # the master's own generation: its workers
        else:
            self.generations.force_out(action.number, action.hard)

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
