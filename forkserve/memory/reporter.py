"""What the master and its workers really cost in memory, and how to show it.

Definitions the numbers rest on:

- RSS counts every resident page a process maps, shared or not, so summing
  RSS over forked workers counts the shared dataset once per worker.
- PSS divides each shared page among the processes mapping it, so the sum
  of PSS over the server is what the server costs the machine.
- USS (Private_Clean + Private_Dirty) is what a process alone pays for: the
  memory freed if it exited.
- The master's RSS is what the application costs in one process. What the
  workers add on top is ``workers_cost = total PSS - master RSS`` and
  ``cost_ratio = total PSS / master RSS``: 1.0 means the workers are free,
  N + 1 means N workers share nothing.

Reading /proc lives in forkserve.memory.procfs; this module turns the readings into
a Report and renders it as a table, JSON (served by the stats endpoint and
read back by ``forkserve memory --stats``) and Prometheus text. The command
itself is forkserve.memory.command.
"""

import dataclasses
import logging
import math
import operator
import re
import time

from forkserve.memory import procfs
from forkserve.memory.procfs import (
    PROC,
    ProcessMemory,
    ProcStat,
    parse_smaps,
    parse_smaps_rollup,
    parse_stat,
    read_process,
)

__all__ = [
    "ProcStat",
    "ProcessInfo",
    "ProcessMemory",
    "ProcessRow",
    "Report",
    "collect",
    "discover",
    "format_table",
    "from_json",
    "log_report",
    "parse_smaps",
    "parse_smaps_rollup",
    "parse_stat",
    "read_process",
    "to_json",
    "to_prometheus",
]

ROLES = ("master", "worker", "single", "supervisor")

#: Version of the to_json() layout. Keys are only ever added; a change that
#: breaks readers bumps this, and from_json() refuses what it cannot read.
JSON_SCHEMA = 1

_SIZES = tuple(attribute for _, attribute in procfs.MEMORY_FIELDS)


@dataclasses.dataclass
class ProcessInfo:
    """What the caller (the master's scoreboard, or discover()) knows of a process."""

    pid: int
    role: str  # "master" | "worker" | "single" | "supervisor"
    worker_id: int | None = None
    requests: int | None = None
    generation: int | None = None

    def __post_init__(self):
        if self.role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}, not {self.role!r}")

    @property
    def label(self):
        """The role as shown in the table: "worker 3", "master"."""
        if self.role == "worker" and self.worker_id is not None:
            return f"worker {self.worker_id}"
        return self.role


@dataclasses.dataclass(frozen=True)
class ProcessRow:
    info: ProcessInfo
    memory: ProcessMemory
    uptime: float  # seconds


@dataclasses.dataclass(frozen=True)
class Report:
    """One reading of the whole server. Totals are derived from the rows."""

    processes: tuple[ProcessRow, ...]
    time: float  # epoch seconds the reading was taken

    @property
    def process_count(self):
        return len(self.processes)

    @property
    def worker_count(self):
        return sum(row.info.role == "worker" for row in self.processes)

    @property
    def master(self):
        """The row of the process holding the application ("single" when it has no
        workers; under a supervisor, the newest generation's), or None."""
        rows = [row for row in self.processes if row.info.role in ("master", "single")]
        return rows[-1] if rows else None

    @property
    def total_pss(self):
        return sum(row.memory.pss for row in self.processes)

    @property
    def total_uss(self):
        return sum(row.memory.uss for row in self.processes)

    @property
    def total_rss(self):
        """Sum of RSS: counts shared pages once per process, so overstates."""
        return sum(row.memory.rss for row in self.processes)

    @property
    def total_shared(self):
        return sum(row.memory.shared for row in self.processes)

    @property
    def total_swap(self):
        return sum(row.memory.swap for row in self.processes)

    @property
    def minor_faults(self):
        return sum(row.memory.minor_faults for row in self.processes)

    @property
    def major_faults(self):
        return sum(row.memory.major_faults for row in self.processes)

    @property
    def requests(self):
        """Requests served by all processes, or None if no process knows."""
        known = [row.info.requests for row in self.processes if row.info.requests is not None]
        return sum(known) if known else None

    @property
    def master_rss(self):
        return self.master.memory.rss if self.master else None

    @property
    def workers_cost(self):
        """Bytes the workers add on top of one process: total PSS - master RSS."""
        return self.total_pss - self.master_rss if self.master else None

    @property
    def cost_ratio(self):
        """Total PSS / master RSS: 1.0 if workers cost nothing."""
        return self.total_pss / self.master_rss if self.master_rss else None


def collect(infos, now=None, *, proc=PROC):
    """Read /proc for each process; those that have exited are left out."""
    now = time.time() if now is None else now
    rows = []
    seen = set()
    for info in infos:
        if info.pid in seen:
            continue
        seen.add(info.pid)
        memory = read_process(info.pid, proc=proc)
        if memory is not None:
            rows.append(ProcessRow(info, memory, max(0.0, now - memory.start_time)))
    return Report(tuple(rows), now)


def discover(master_pid, *, proc=PROC):
    """The master and its children, as ProcessInfo (master first).

    Children are "worker" with worker_id None (only the master knows ids);
    a master without children is "single". Raises ProcessLookupError if
    master_pid is not running.
    """
    if procfs.read_stat(master_pid, proc=proc) is None:
        raise ProcessLookupError(f"no process {master_pid}")
    children = procfs.child_pids(master_pid, proc=proc)
    if not children:
        return [ProcessInfo(master_pid, "single")]
    return [ProcessInfo(master_pid, "master")] + [ProcessInfo(pid, "worker") for pid in children]


# -- JSON -------------------------------------------------------------------


def to_json(report):
    """The report as JSON-ready data. Sizes in bytes, times in seconds::

        {"schema": 1,
         "time": epoch seconds of the reading,
         "processes": [{"pid", "role", "worker_id", "generation", "requests",
                        "start_time", "uptime",
                        "rss", "pss", "shared_clean", "shared_dirty",
                        "private_clean", "private_dirty", "swap",
                        "uss", "shared", "shared_fraction",
                        "minor_faults", "major_faults"}, ...],
         "totals": {"processes", "workers", "rss", "pss", "uss", "swap",
                    "master_rss", "workers_cost", "cost_ratio",
                    "minor_faults", "major_faults", "requests"}}

    Unknown values are null: worker_id, generation, requests (when the
    caller does not know them); master_rss, workers_cost, cost_ratio (when
    there is no master). "uss", "shared", "shared_fraction" and "totals" are
    derived, for readers' convenience; from_json() recomputes them.
    """
    processes = []
    for row in report.processes:
        info, memory = row.info, row.memory
        entry = {
            "pid": info.pid,
            "role": info.role,
            "worker_id": info.worker_id,
            "generation": info.generation,
            "requests": info.requests,
            "start_time": memory.start_time,
            "uptime": row.uptime,
        }
        entry.update((name, getattr(memory, name)) for name in _SIZES)
        entry.update(
            uss=memory.uss,
            shared=memory.shared,
            shared_fraction=memory.shared_fraction,
            minor_faults=memory.minor_faults,
            major_faults=memory.major_faults,
        )
        processes.append(entry)
    totals = {
        "processes": report.process_count,
        "workers": report.worker_count,
        "rss": report.total_rss,
        "pss": report.total_pss,
        "uss": report.total_uss,
        "swap": report.total_swap,
        "master_rss": report.master_rss,
        "workers_cost": report.workers_cost,
        "cost_ratio": report.cost_ratio,
        "minor_faults": report.minor_faults,
        "major_faults": report.major_faults,
        "requests": report.requests,
    }
    return {"schema": JSON_SCHEMA, "time": report.time, "processes": processes, "totals": totals}


def from_json(obj):
    """Rebuild a Report from to_json() output; ValueError if it is not one."""
    if not isinstance(obj, dict) or not isinstance(obj.get("processes"), list):
        raise ValueError("not a forkserve memory report: no list of processes")
    if obj.get("schema") != JSON_SCHEMA:
        raise ValueError(
            f"memory report schema {obj.get('schema')!r}, this forkserve reads "
            f"{JSON_SCHEMA}: run the same forkserve version as the server"
        )
    try:
        rows = tuple(_row_from_json(entry) for entry in obj["processes"])
        return Report(rows, float(obj["time"]))
    except KeyError as exc:
        raise ValueError(f"not a forkserve memory report: missing {exc}") from None
    except (TypeError, ValueError) as exc:
        raise ValueError(f"not a forkserve memory report: {exc}") from None


def _row_from_json(entry):
    info = ProcessInfo(
        pid=int(entry["pid"]),
        role=entry["role"],
        worker_id=_optional_int(entry.get("worker_id")),
        requests=_optional_int(entry.get("requests")),
        generation=_optional_int(entry.get("generation")),
    )
    memory = ProcessMemory(
        pid=info.pid,
        minor_faults=int(entry["minor_faults"]),
        major_faults=int(entry["major_faults"]),
        start_time=float(entry["start_time"]),
        **{name: int(entry[name]) for name in _SIZES},
    )
    return ProcessRow(info, memory, float(entry["uptime"]))


def _optional_int(value):
    return None if value is None else int(value)


# -- Table ------------------------------------------------------------------

_COLUMNS = (
    "PID", "ROLE", "RSS", "PSS", "SHARED", "PRIVATE(USS)", "SWAP",
    "MINFLT", "MAJFLT", "REQS", "UPTIME",
)


def format_table(report):
    """A fixed-width table, one row per process plus a total row and summary."""
    lines = [_COLUMNS]
    for row in report.processes:
        info, memory = row.info, row.memory
        lines.append((
            str(info.pid),
            info.label,
            format_size(memory.rss),
            format_size(memory.pss),
            format_size(memory.shared),
            format_size(memory.uss),
            format_size(memory.swap),
            str(memory.minor_faults),
            str(memory.major_faults),
            _or_dash(info.requests),
            format_duration(row.uptime),
        ))
    lines.append((
        "",
        "total",
        format_size(report.total_rss),
        format_size(report.total_pss),
        format_size(report.total_shared),
        format_size(report.total_uss),
        format_size(report.total_swap),
        str(report.minor_faults),
        str(report.major_faults),
        _or_dash(report.requests),
        "",
    ))
    widths = [max(len(line[i]) for line in lines) for i in range(len(_COLUMNS))]
    text = [
        "  ".join(
            cell.ljust(width) if i == 1 else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(line, widths))
        ).rstrip()
        for line in lines
    ]
    return "\n".join(text + [_summary(report)])


def _summary(report):
    if not report.processes:
        return "no processes: the server has exited"
    if report.master is None:
        return f"total PSS {format_size(report.total_pss)} (no master process, so no cost ratio)"
    if report.master.info.role == "single":
        return f"total PSS {format_size(report.total_pss)}: a single process, no workers"
    return (
        f"total PSS {format_size(report.total_pss)} = master RSS "
        f"{format_size(report.master_rss)} x {report.cost_ratio:.2f} "
        f"(workers add {format_size(report.workers_cost)})"
    )


def log_report(logger, report, level=logging.INFO):
    """Log each process's shared and private memory, then the summary line."""
    for row in report.processes:
        memory = row.memory
        logger.log(
            level, "Memory of %s (pid %d): RSS %s, PSS %s, shared %s (%.0f%%), private %s, swap %s",
            row.info.label, row.info.pid, format_size(memory.rss), format_size(memory.pss),
            format_size(memory.shared), 100 * memory.shared_fraction, format_size(memory.uss),
            format_size(memory.swap),
        )
    logger.log(level, "Memory: %s", _summary(report))


def _or_dash(value):
    return "-" if value is None else str(value)


def format_size(n):
    """Bytes in binary units: "512 B", "1.5 KiB", "260.1 MiB", "1.0 GiB"."""
    sign, n = ("-", -n) if n < 0 else ("", n)
    if n < 1024:
        return f"{sign}{n} B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        n /= 1024
        if n < 1024 or unit == "TiB":
            return f"{sign}{n:.1f} {unit}"


def format_duration(seconds):
    """Seconds as "42s", "5m03s", "2h05m", "3d04h"."""
    s = int(seconds)
    days, s = divmod(s, 86400)
    hours, s = divmod(s, 3600)
    minutes, s = divmod(s, 60)
    if days:
        return f"{days}d{hours:02d}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{s:02d}s"
    return f"{s}s"


# -- Prometheus ---------------------------------------------------------------

# (name after "<prefix>_process_", type, attribute of a ProcessRow, help)
_PROCESS_METRICS = (
    ("rss_bytes", "gauge", "memory.rss", "Resident set size; shared pages counted in full."),
    ("pss_bytes", "gauge", "memory.pss", "Proportional set size; shared pages split up."),
    ("uss_bytes", "gauge", "memory.uss", "Unique set size: Private_Clean + Private_Dirty."),
    ("shared_clean_bytes", "gauge", "memory.shared_clean", "Shared_Clean from smaps."),
    ("shared_dirty_bytes", "gauge", "memory.shared_dirty", "Shared_Dirty from smaps."),
    ("private_clean_bytes", "gauge", "memory.private_clean", "Private_Clean from smaps."),
    ("private_dirty_bytes", "gauge", "memory.private_dirty", "Private_Dirty from smaps."),
    ("swap_bytes", "gauge", "memory.swap", "Swapped-out memory."),
    ("shared_ratio", "gauge", "memory.shared_fraction", "Shared part of resident memory, 0 to 1."),
    ("start_time_seconds", "gauge", "memory.start_time", "Start time since the Unix epoch."),
    ("minor_faults_total", "counter", "memory.minor_faults", "Minor page faults."),
    ("major_faults_total", "counter", "memory.major_faults", "Major page faults (read from disk)."),
    ("requests_total", "counter", "info.requests", "Requests served."),
)

# (name after "<prefix>_", type, attribute of the Report, help)
_SERVER_METRICS = (
    ("server_processes", "gauge", "process_count", "Processes in the server, master included."),
    ("server_pss_bytes", "gauge", "total_pss", "Sum of PSS: what the server costs the machine."),
    ("server_uss_bytes", "gauge", "total_uss", "Sum of USS over the server."),
    ("server_swap_bytes", "gauge", "total_swap", "Sum of swap over the server."),
    ("master_rss_bytes", "gauge", "master_rss", "Master RSS: the application in one process."),
    ("workers_cost_bytes", "gauge", "workers_cost", "Server PSS - master RSS: what workers add."),
    ("cost_ratio", "gauge", "cost_ratio", "Server PSS / master RSS; 1 means the workers are free."),
)

_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")


def to_prometheus(report, prefix="forkserve"):
    """The report in Prometheus text exposition format 0.0.4.

    Per-process series are labelled pid, role and worker (worker only when
    the id is known); unknown values (requests, the ratio without a master)
    are left out rather than reported as 0.
    """
    if not _METRIC_NAME.match(prefix):
        raise ValueError(f"prefix {prefix!r} is not a valid Prometheus metric name")
    out = []
    for suffix, kind, attribute, help_text in _PROCESS_METRICS:
        name = f"{prefix}_process_{suffix}"
        out += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
        value_of = operator.attrgetter(attribute)
        for row in report.processes:
            value = value_of(row)
            if value is not None:
                out.append(f"{name}{{{_labels(row.info)}}} {_number(value)}")
    for suffix, kind, attribute, help_text in _SERVER_METRICS:
        name = f"{prefix}_{suffix}"
        out += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
        value = getattr(report, attribute)
        if value is not None:
            out.append(f"{name} {_number(value)}")
    return "\n".join(out) + "\n"


def _labels(info):
    labels = [("pid", str(info.pid)), ("role", info.role)]
    if info.worker_id is not None:
        labels.append(("worker", str(info.worker_id)))
    return ",".join(f'{key}="{_escape_label(value)}"' for key, value in labels)


def _escape_label(value):
    return value.replace("\\", r"\\").replace('"', r"\"").replace("\n", r"\n")


def _number(value):
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)

