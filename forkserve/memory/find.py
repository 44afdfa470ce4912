"""Which server `forkserve memory` reports on: the one named, or every one.

A TARGET is whatever the user has to hand: a pid (a master's, a worker's or
a supervisor's: each leads to its server), the pid file given to --pid, or
the address given to --stats. Without one, every forkserve server on the
machine is found by its process titles (forkserve.process.procname: "NAME:
ROLE [APP]"): a titled process whose parent is not titled is a server's root
(a supervisor, a master or a single process), the others belong to it.
Gunicorn titles its masters and workers the same way, so a root counts as
forkserve's when its title starts "forkserve: " (the default --name), when
its role is one Gunicorn has not (a single process, -w 0, or a supervisor),
or when it, or a child, is a master listening for `--why`
(forkserve.memory.copied_objects's abstract socket, listed in
/proc/net/unix).

`classify`, `roots` and `root_of` only decide; `titled_processes` and
`why_listeners` read /proc.
"""

import os
import re

from forkserve.memory import procfs

__all__ = ["classify", "roots", "root_of", "servers", "titled_processes", "why_listeners"]

_WHY_SOCKET = re.compile(r" @forkserve-why-(\d+)$", re.MULTILINE)
#: Roles no Gunicorn process has in its title, whatever --name says.
_FORKSERVE_ONLY_ROLES = frozenset({"single", "supervisor"})


def classify(target, isfile=os.path.isfile):
    """("pid", int), ("pidfile", path) or ("stats", address) for a TARGET;
    ValueError saying what to give when it is none of them."""
    text = target.strip()
    if text.isdigit():
        return "pid", int(text)
    if text.startswith(("unix:", "http://")):
        return "stats", text
    if isfile(text):
        return "pidfile", text
    _, colon, port = text.rpartition(":")
    if colon and port.isdigit():
        return "stats", text
    raise ValueError(
        f"{target!r} is not a pid, an existing pid file or a stats address: give the server's "
        "pid (`forkserve memory` alone lists the servers running), the FILE it was started "
        "with --pid FILE, or the HOST:PORT (or unix:PATH) of its --stats")


def roots(processes, listeners=frozenset()):
    """The pids of the forkserve servers' roots, given {pid: (title text,
    parent pid)} of every titled process and the pids of masters listening
    for --why: titled processes whose parent is not titled."""
    children = {}
    for pid, (_, parent) in processes.items():
        children.setdefault(parent, []).append(pid)
    return sorted(pid for pid, (text, parent) in processes.items()
                  if parent not in processes and (
                      text.startswith("forkserve: ") or pid in listeners
                      or procfs.parse_title(text).role in _FORKSERVE_ONLY_ROLES
                      or any(child in listeners for child in children.get(pid, ()))))


def root_of(pid, processes):
    """The root of the server that pid belongs to (pid itself if untitled)."""
    seen = set()
    while pid in processes and processes[pid][1] in processes and pid not in seen:
        seen.add(pid)
        pid = processes[pid][1]
    return pid


def titled_processes(proc=procfs.PROC):
    """{pid: (title text, parent pid)} of every running forkserve process."""
    found = {}
    for entry in os.listdir(proc):
        if not entry.isdigit():
            continue
        pid = int(entry)
        try:
            text = procfs.read_title(pid, proc=proc)
            if not procfs.parse_title(text):
                continue
            stat = procfs.read_stat(pid, proc=proc)
        except PermissionError:  # another user's process, hidden (hidepid)
            continue
        if stat is not None:
            found[pid] = (text, stat.ppid)
    return found


def why_listeners(proc=procfs.PROC):
    """Pids of the masters listening for --why (from /proc/net/unix)."""
    try:
        with open(f"{proc}/net/unix") as table:
            return {int(pid) for pid in _WHY_SOCKET.findall(table.read())}
    except FileNotFoundError:  # no /proc/net (a container without it)
        return set()


def servers(proc=procfs.PROC):
    """(roots of the forkserve servers running, titled_processes())."""
    processes = titled_processes(proc)
    return roots(processes, why_listeners(proc)), processes
