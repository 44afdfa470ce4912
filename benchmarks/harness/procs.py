"""Process groups and /proc readings: start a server in its own group, find
its processes, read their CPU time, memory, context switches and scheduler
times, stop them. Every /proc/PID read of the scenarios is here.

Every process the harness starts (servers, wrk) gets a new session, so its
process group id is its pid and every process it forks inherits that group.
That gives three things at once:

- the server's process tree is "every live process in group PID", whatever
  it names its workers and however deep it forks (uWSGI, Gunicorn and
  forkserve all keep their workers in the master's group);
- one ``killpg`` stops the whole tree, even when the master died first and
  left orphans behind;
- the harness itself, in another group, never receives those signals.

Memory is read with forkserve's own /proc reader (``forkserve.memory``):
one parser for smaps_rollup in the project, used for every server here,
including those that have no stats endpoint.
"""

import dataclasses
import errno
import os
import re
import signal
import subprocess
import time

from forkserve.memory.procfs import read_process

__all__ = ["Group", "Sample", "alive", "cmdline", "context_switches", "cpu_seconds",
           "group_cpu_seconds", "group_members", "parse_cpu_seconds", "rss", "sample_group",
           "schedstat", "schedstat_fields", "switches_from_status"]

#: Errors meaning "no such process (any more)".
_GONE_ERRNOS = frozenset({errno.ESRCH, errno.ENOENT})

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def parse_cpu_seconds(stat_text, clock_ticks=_CLOCK_TICKS):
    """utime + stime, in seconds, from one /proc/PID/stat line.

    (forkserve.memory.procfs parses the fields its reporter needs; CPU time is
    not among them.) The command name may contain spaces and parentheses,
    so fields are counted from the last ")": utime and stime are fields 14
    and 15 of proc(5), the 12th and 13th after it.
    """
    rest = stat_text[stat_text.rindex(")") + 2:].split()
    return (int(rest[11]) + int(rest[12])) / clock_ticks


def cpu_seconds(pid, proc="/proc"):
    """CPU time the process has used so far, or None if it has exited."""
    try:
        with open(f"{proc}/{pid}/stat") as f:
            return parse_cpu_seconds(f.read())
    except OSError as exc:
        if exc.errno in _GONE_ERRNOS:
            return None
        raise


def _read(path):
    """The text of a /proc file, or None if its process has exited."""
    try:
        with open(path, "rb") as f:
            return f.read().decode("utf-8", "replace")
    except OSError as exc:
        if exc.errno in _GONE_ERRNOS:
            return None
        raise


def cmdline(pid, proc="/proc"):
    """The process's command line (its title), NULs as spaces; b"" once it has exited."""
    text = _read(f"{proc}/{pid}/cmdline")
    return text.replace("\0", " ").encode() if text else b""


_SWITCHES = re.compile(r"^(?:non)?voluntary_ctxt_switches:\s+(\d+)$", re.M)


def switches_from_status(text):
    """Voluntary + involuntary context switches in a /proc/PID/status text."""
    return sum(int(n) for n in _SWITCHES.findall(text))


def context_switches(pid, proc="/proc"):
    """The process's context switches so far (0 once it has exited)."""
    text = _read(f"{proc}/{pid}/status")
    return switches_from_status(text) if text else 0


def rss(pid, proc="/proc"):
    """VmRSS in bytes, from /proc/PID/status; None once the process has exited."""
    text = _read(f"{proc}/{pid}/status") or ""
    found = re.search(r"^VmRSS:\s+(\d+) kB", text, re.M)
    return int(found.group(1)) * 1024 if found else None


def schedstat_fields(text):
    """(ns on a CPU, ns runnable but waiting, turns on a CPU) from a
    /proc/PID/schedstat text."""
    on_cpu, waiting, turns = (int(field) for field in text.split()[:3])
    return on_cpu, waiting, turns


def schedstat(pid, proc="/proc"):
    """The main thread's schedstat_fields; (0, 0, 0) once the process has exited."""
    text = _read(f"{proc}/{pid}/schedstat")
    return schedstat_fields(text) if text else (0, 0, 0)


def group_cpu_seconds(pgid, proc="/proc"):
    """CPU seconds so far of the live processes of group ``pgid``."""
    return sum(filter(None, (cpu_seconds(pid, proc) for pid in group_members(pgid, proc))))


def alive(pid, proc="/proc"):
    """True while ``pid`` exists and is not a zombie."""
    try:
        return not _is_zombie(pid, proc)
    except OSError as exc:
        if exc.errno in _GONE_ERRNOS:
            return False
        raise


def group_members(pgid, proc="/proc"):
    """Pids of the live processes in process group ``pgid``, sorted.

    Zombies are left out: they are dead, and an orphaned one may wait a
    while for a reaper (in a container, pid 1 may never reap it).
    """
    members = []
    for entry in os.listdir(proc):
        if not entry.isdigit():
            continue
        try:
            if os.getpgid(int(entry)) == pgid and not _is_zombie(entry, proc):
                members.append(int(entry))
        except OSError as exc:
            if exc.errno not in _GONE_ERRNOS:
                raise
    return sorted(members)


def _is_zombie(pid, proc):
    with open(f"{proc}/{pid}/stat") as f:
        text = f.read()
    return text[text.rindex(")") + 2:].startswith(("Z", "X"))


@dataclasses.dataclass(frozen=True)
class Sample:
    """One process's memory at one moment (sizes in bytes)."""

    pid: int
    role: str  # "master", "worker" or "single"
    rss: int
    pss: int
    uss: int
    private: int  # anonymous private: copies (forkserve.memory.model)
    file: int  # resident file-backed pages, page cache
    shared: int
    swap: int
    minor_faults: int
    major_faults: int
    cpu_s: float


def sample_group(root_pid, single):
    """Read every process in ``root_pid``'s group.

    The root is the "master", the others "worker"s; a server that does not
    fork (``single``) has one process, the "single". Processes that exit
    while we read are left out. Wrappers that ``exec`` (taskset, sh) keep
    the pid, so the root is the server itself.
    """
    samples = []
    for pid in group_members(root_pid):
        mem = read_process(pid)
        cpu = cpu_seconds(pid)
        if mem is None or cpu is None:
            continue
        if single:
            role = "single"
        else:
            role = "master" if pid == root_pid else "worker"
        samples.append(Sample(
            pid=pid, role=role, rss=mem.rss, pss=mem.pss, uss=mem.uss,
            private=mem.private, file=mem.file,
            shared=mem.shared_clean + mem.shared_dirty, swap=mem.swap,
            minor_faults=mem.minor_faults, major_faults=mem.major_faults, cpu_s=cpu,
        ))
    return samples


class Group:
    """A started process and its whole process group, stopped on exit.

    Use as a context manager, or call :meth:`stop`; stopping twice is fine.
    """

    def __init__(self, argv, *, log_path=None, **popen_kwargs):
        self.argv = list(argv)
        self.log_path = log_path
        self._log = open(log_path, "ab") if log_path else subprocess.DEVNULL
        try:
            self.popen = subprocess.Popen(
                self.argv, start_new_session=True,
                stdout=popen_kwargs.pop("stdout", self._log),
                stderr=popen_kwargs.pop("stderr", self._log),
                stdin=popen_kwargs.pop("stdin", subprocess.DEVNULL),
                **popen_kwargs,
            )
        except BaseException:
            self._close_log()
            raise
        self.pid = self.popen.pid

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.stop()

    def alive(self):
        return self.popen.poll() is None

    def members(self):
        return group_members(self.pid)

    def send_signal(self, signum):
        """Send ``signum`` to the whole group; False if it is already gone."""
        try:
            os.killpg(self.pid, signum)
        except ProcessLookupError:
            return False
        return True

    def stop(self, sig=signal.SIGTERM, grace=20.0):
        """Signal the group, wait up to ``grace`` s for all of it, then SIGKILL.

        Returns the seconds it took the group to disappear after ``sig``.
        """
        started = time.monotonic()
        if self.send_signal(sig):
            deadline = started + grace
            while time.monotonic() < deadline:
                self.popen.poll()  # reap the root so it stops counting
                if not self.members():
                    break
                time.sleep(0.05)
            else:
                self.send_signal(signal.SIGKILL)
        try:
            self.popen.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.send_signal(signal.SIGKILL)
            self.popen.wait()
        self._close_log()
        return time.monotonic() - started

    def _close_log(self):
        if self._log is not subprocess.DEVNULL and not self._log.closed:
            self._log.close()
