"""The memory report: which processes make up the server, and what they cost.

Definitions the numbers rest on (the per-process figures are
forkserve.memory.procfs.ProcessMemory's):

- RSS counts every resident page a process maps, shared or not, so summing
  RSS over forked workers counts the shared dataset once per worker.
- PSS divides each shared page among the processes mapping it, so the sum
  of PSS over the server is what the server costs the machine.
- private (min(Private_Dirty, Anonymous)) is the anonymous memory a process
  alone holds: a worker's copy-on-write copies of the master's pages and its
  own allocations. It is what --max-worker-memory limits and what the
  workers' "copied" total adds up.
- file (Rss - Anonymous) is resident file-backed memory: the mapped store,
  libraries. It sits once in the page cache whoever maps it, and the kernel
  can drop its clean pages at any time, so it is shown apart and never
  limited. USS (Private_Clean + Private_Dirty) mixes the two and is kept
  only in JSON and Prometheus, for readers that want it.
- The ratio compares the server with the application in one process, on the
  memory forking can duplicate: anonymous memory. ``cost_ratio = sum of
  Pss_Anon / master's Anonymous`` and ``workers_cost = sum of Pss_Anon -
  master's Anonymous``: 1.0 means the workers are free, N + 1 means N
  workers share nothing. File pages stay out of it: a worker that alone
  reads 300 MB of a mapped store adds 300 MB of page cache (shown as file
  PSS), not a copy. Kernels before 5.13 print no Pss_Anon; there the basis
  is all memory, ``total PSS / master RSS`` (``ratio_basis`` says which).

The server is a tree. Without reloads: a master and its workers (or a single
process). After a HUP: a supervisor (no application), the master of the
generation serving and its workers, and for a while a generation still
draining or one starting. "The master" of the ratio is always the serving
generation's; the supervisor and other generations still count in the
totals, since the machine pays for them.
"""

import dataclasses
import os
import sys
import time

from forkserve.memory import procfs
from forkserve.memory.procfs import PROC, ProcessMemory, read_process

__all__ = [
    "ProcessInfo", "ProcessRow", "Report", "collect", "discover", "read_processes",
    "supervised_infos", "tree_infos",
]

ROLES = ("master", "worker", "single", "supervisor")

#: States of a generation (and its processes) under a supervisor; None
#: outside one.
STATES = (None, "serving", "starting", "draining")


@dataclasses.dataclass
class ProcessInfo:
    """What the caller (the master's scoreboard, or discover()) knows of a process."""

    pid: int
    role: str  # "master" | "worker" | "single" | "supervisor"
    worker_id: int | None = None
    requests: int | None = None
    generation: int | None = None
    state: str | None = None  # see STATES
    gc_collections: int | None = None  # the worker's own (forkserve.memory.workergc)
    gc_pause: float | None = None  # seconds, summed over those collections
    connections: int | None = None  # a worker's open connections, now
    accepted: int | None = None  # connections the worker has accepted

    def __post_init__(self):
        if self.role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}, not {self.role!r}")
        if self.state not in STATES:
            raise ValueError(f"state must be one of {STATES}, not {self.state!r}")

    @property
    def label(self):
        """The role as shown in the table: "worker 3", "master g2 draining"."""
        text = self.role
        if self.role == "worker" and self.worker_id is not None:
            text = f"worker {self.worker_id}"
        if self.state is not None and self.generation is not None:
            text = f"{text} g{self.generation}"
        if self.state in ("starting", "draining"):
            text = f"{text} {self.state}"
        return text


@dataclasses.dataclass(frozen=True)
class ProcessRow:
    info: ProcessInfo
    memory: ProcessMemory
    uptime: float  # seconds


def _total(attribute):
    return property(lambda report: sum(getattr(row.memory, attribute)
                                       for row in report.processes),
                    doc=f"Sum of {attribute} over the server.")


@dataclasses.dataclass(frozen=True)
class Report:
    """One reading of the whole server. Totals are derived from the rows."""

    processes: tuple[ProcessRow, ...]
    time: float  # epoch seconds the reading was taken

    total_rss = _total("rss")  # counts shared pages once per process, so overstates
    total_pss = _total("pss")
    total_uss = _total("uss")
    total_private = _total("private")
    total_file = _total("file")  # counts shared page-cache pages once per process
    total_pss_anon = _total("pss_anon")
    total_pss_file = _total("pss_file")
    total_shared = _total("shared")
    total_swap = _total("swap")
    minor_faults = _total("minor_faults")
    major_faults = _total("major_faults")

    @property
    def process_count(self):
        return len(self.processes)

    @property
    def worker_count(self):
        return sum(row.info.role == "worker" for row in self.processes)

    @property
    def master(self):
        """The row of the process holding the serving application (its
        generation's master, or "single" without workers), or None."""
        for row in self.processes:
            if row.info.role in ("master", "single") and row.info.state in (None, "serving"):
                return row
        return None

    @property
    def serving_workers(self):
        """The rows of the serving master's workers (of its generation)."""
        master = self.master
        generation = master.info.generation if master else None
        return [row for row in self.processes
                if row.info.role == "worker" and row.info.state in (None, "serving")
                and (generation is None or row.info.generation in (None, generation))]

    @property
    def copied(self):
        """Private (anonymous) memory of the serving master's workers."""
        return sum(row.memory.private for row in self.serving_workers)

    @property
    def gc_collections(self):
        """Garbage collections in the workers, or None if no process knows."""
        return _known_sum(row.info.gc_collections for row in self.processes)

    @property
    def gc_pause(self):
        return _known_sum(row.info.gc_pause for row in self.processes)

    @property
    def requests(self):
        """Requests served by all processes, or None if no process knows."""
        known = [row.info.requests for row in self.processes if row.info.requests is not None]
        return sum(known) if known else None

    @property
    def master_rss(self):
        return self.master.memory.rss if self.master else None

    @property
    def ratio_basis(self):
        """"anonymous" where the kernel prints Pss_Anon (5.13+), else "all"."""
        return "anonymous" if any(row.memory.pss_anon for row in self.processes) else "all"

    @property
    def master_base(self):
        """The master's memory the ratio divides by: Anonymous, or RSS."""
        if self.master is None:
            return None
        memory = self.master.memory
        return memory.anonymous if self.ratio_basis == "anonymous" else memory.rss

    @property
    def total_base(self):
        """The server's memory the ratio measures: sum of Pss_Anon, or of PSS."""
        return self.total_pss_anon if self.ratio_basis == "anonymous" else self.total_pss

    @property
    def workers_cost(self):
        """Bytes the workers add on top of one process: total_base - master_base."""
        return self.total_base - self.master_base if self.master else None

    @property
    def cost_ratio(self):
        """total_base / master_base: 1.0 if workers cost nothing."""
        return self.total_base / self.master_base if self.master_base else None


def _known_sum(values):
    known = [value for value in values if value is not None]
    return sum(known) if known else None


def collect(infos, now=None, *, proc=PROC, read=read_process):
    """Read /proc for each process; those that have exited are left out."""
    now = time.time() if now is None else now
    unique = list({info.pid: info for info in reversed(infos)}.values())[::-1]
    rows = []
    for info, memory in zip(unique, _read_all([info.pid for info in unique], proc, read)):
        if memory is not None:
            rows.append(ProcessRow(info, memory, max(0.0, now - memory.start_time)))
    return Report(tuple(rows), now)


def _read_all(pids, proc, read):
    return read_processes(pids, proc=proc, read=read)


def read_processes(pids, *, proc=PROC, read=None, threads=None):
    """read_process() of each pid, in order, reading several at once.

    Each read is one kernel page walk (the PSS computation), and reading a
    /proc file releases the GIL, so threads make the walks run on every CPU
    at once. They are real OS threads even where gevent monkey-patched
    threading (the master), since a greenlet would block on each read.
    """
    read = read or read_process
    pids = list(pids)
    threads = min(len(pids), threads or os.cpu_count() or 1)
    if threads <= 1:
        return [read(pid, proc=proc) for pid in pids]
    start_thread, allocate_lock = _os_threads()
    results = [None] * len(pids)
    pending = list(enumerate(pids))
    errors = []
    done = []

    def work(finished):
        try:
            while pending:
                try:
                    index, pid = pending.pop()
                except IndexError:  # another thread took the last one
                    break
                results[index] = read(pid, proc=proc)
        except BaseException as exc:  # handed to the caller below
            errors.append(exc)
        finally:
            finished.release()

    for _ in range(threads):
        finished = allocate_lock()
        finished.acquire()
        done.append(finished)
        start_thread(work, (finished,))
    for finished in done:
        finished.acquire()
    if errors:
        raise errors[0]
    return results


def _os_threads():
    """(start_new_thread, allocate_lock) of the OS, even under gevent."""
    monkey = sys.modules.get("gevent.monkey")
    if monkey is not None and monkey.is_module_patched("threading"):
        return monkey.get_original("_thread", ["start_new_thread", "allocate_lock"])
    import _thread
    return _thread.start_new_thread, _thread.allocate_lock


def _title_in(proc):
    return lambda pid: procfs.parse_title(procfs.read_title(pid, proc=proc))


def _children_in(proc):
    return lambda pid: procfs.child_pids(pid, proc=proc)


def discover(pid, *, proc=PROC):
    """The processes of the server whose pid file names pid, as ProcessInfo.

    Reads process titles and children from /proc (see tree_infos). Raises
    ProcessLookupError if pid is not running.
    """
    if procfs.read_stat(pid, proc=proc) is None:
        raise ProcessLookupError(f"no process {pid}")
    return tree_infos(pid, title_of=_title_in(proc), children_of=_children_in(proc))


def tree_infos(root, *, title_of, children_of):
    """Label the process tree under root (pure: the readers are injected).

    title_of(pid) gives a procfs.Title or None, children_of(pid) a list of
    pids. Three shapes:

    - a supervisor (its title says so or, untitled, a child of it has
      children): every child is a generation's master;
    - a master handing over to its first generation: children titled
      "generation N" are that generation's master, the others its own
      workers (generation 1);
    - a master and its workers, or a single process.

    The generation a title says is served ("serving generation N"; else the
    newest, or during a handover the master's own) is "serving", older ones
    "draining", newer ones "starting".
    """
    title = title_of(root)
    children = children_of(root)
    titles = {child: title_of(child) for child in children}
    numbers = {child: t.generation for child, t in titles.items() if t and t.generation}
    serving = title.serving if title is not None else None
    if title is not None and title.role == "supervisor" or (
            title is None and any(children_of(child) for child in children)):
        numbers = {child: numbers.get(child) for child in children}
        known = [number for number in numbers.values() if number is not None]
        serving = serving or (max(known) if known else None)
        generations = [(pid, number, _state(number, serving)) for pid, number in numbers.items()]
        return supervised_infos(root, generations, title_of=title_of, children_of=children_of)
    own = [child for child in children if child not in numbers]
    if not numbers:  # a master is generation 1 unless a reload started it (its title says)
        generation = None if title is None else title.generation or 1
        return _master_and_workers(root, own, generation, None, titles.get)
    serving = serving or 1
    entries = [(root, own, 1, _state(1, serving))] + [
        (pid, children_of(pid), number, _state(number, serving))
        for pid, number in numbers.items()]
    return _in_order(entries, title_of)


def _state(number, serving):
    if number is None or serving is None or number == serving:
        return "serving"
    return "draining" if number < serving else "starting"


_ORDER = {"serving": 0, "draining": 1, "starting": 2}


def supervised_infos(supervisor, generations, *, title_of=None, children_of=None,
                     proc=PROC):
    """A supervisor, then each generation's master and workers: the serving
    one first, then draining, then starting ones.

    generations is [(master pid, generation number, state)]; title_of and
    children_of default to reading /proc.
    """
    title_of = title_of or _title_in(proc)
    children_of = children_of or _children_in(proc)
    entries = [(pid, children_of(pid), number, state) for pid, number, state in generations]
    return [ProcessInfo(supervisor, "supervisor")] + _in_order(entries, title_of)


def _in_order(entries, title_of):
    """entries: [(master pid, its children, generation, state)]."""
    infos = []
    for pid, children, number, state in sorted(entries, key=lambda e: (_ORDER[e[3]], e[2] or 0)):
        infos += _master_and_workers(pid, children, number, state, title_of)
    return infos


def _master_and_workers(pid, children, generation, state, title_of):
    if not children:
        title = title_of(pid)
        return [ProcessInfo(pid, "single", requests=title.requests if title else None,
                            generation=generation, state=state)]
    infos = [ProcessInfo(pid, "master", generation=generation, state=state)]
    for child in children:
        child_title = title_of(child)
        worker_id = child_title.worker_id if child_title else None
        requests = child_title.requests if child_title else None
        infos.append(ProcessInfo(child, "worker", worker_id=worker_id, requests=requests,
                                 generation=generation, state=state))
    return infos
