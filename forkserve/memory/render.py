"""A memory report (forkserve.memory.model.Report) as people and Prometheus read it.

The table and the log lines show, per process, PRIVATE (anonymous memory the
process alone holds: copy-on-write copies and its own allocations, what
--max-worker-memory limits) and FILE (resident file-backed pages, shared
through the page cache and reclaimable) apart; see model's definitions.
"""

import collections
import logging
import math
import operator
import re

__all__ = ["breakdown", "format_duration", "format_size", "format_table", "headline",
           "log_report", "to_prometheus"]

_COLUMNS = (
    "PID", "ROLE", "RSS", "PSS", "SHARED", "PRIVATE", "FILE", "SWAP",
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
            format_size(memory.private),
            format_size(memory.file),
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
        format_size(report.total_private),
        format_size(report.total_file),
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
    return "\n".join(text + _summary_lines(report))


def headline(report):
    """What the server costs, first, then what it is made of:
    "5 processes use 301.1 MiB: 278.8 MiB for one copy of the application, 5.6 MiB
    more for each of 4 workers".

    The first figure is the sum of PSS (each shared page split among its
    sharers: what the machine pays), so two runs of one application rank by
    their first figures, cheapest first. No factor over the sum of RSS
    ("without sharing") follows it: that factor says how much is shared, not
    what is paid, so a run sharing a big heap read better than a cheaper one
    with little to share (issue #33: PersonDB's store, share and dict runs read
    3.8x, 4.9x and 1.8x less at 301 MiB, 947 MiB and 2.5 GiB). Its parts are
    in bytes too: the application once (the serving master's memory, every
    file page counted once, as the page cache holds it), what its workers add
    to that (their Pss_Anon and the master's, beyond the master's Anonymous;
    PSS beyond RSS before Linux 5.13), split evenly, and what any other process
    (a supervisor, a generation starting or draining) adds, by name.
    """
    count = report.process_count
    if not count:
        return "no processes: the server has exited"
    used = format_size(report.total_pss)
    master = report.master
    if count == 1:
        if master is not None and master.info.role == "master":
            return f"1 process uses {used} (the master alone: no worker is running)"
        return f"1 process uses {used} (a single process: nothing to share)"
    if master is None:
        return f"{count} processes use {used} (no serving master to tell what each adds)"
    # What the serving master's workers add to it, never below nothing: a sum
    # of PSS can trail the master's own reading by pages that changed between
    # the reads. The other processes (a supervisor, a generation starting or
    # draining) add their own PSS (Pss_Anon: their file pages are in "once").
    workers = report.serving_workers
    rest = [row for row in report.processes if row is not master and row not in workers]
    base = (lambda row: row.memory.pss_anon) if report.ratio_basis == "anonymous" else (
        lambda row: row.memory.pss)
    added = max(0, sum(base(row) for row in [master, *workers]) - report.master_base)
    rest_added = sum(base(row) for row in rest)
    once = format_size(report.total_pss - added - rest_added)
    text = f"{count} processes use {used}: {once} for one copy of the application"
    if len(workers) == 1:
        text += f", {format_size(added)} more for its worker"
    elif workers:
        text += f", {format_size(added // len(workers))} more for each of {len(workers)} workers"
    if len(rest) == 1:
        text += f"; the {_role(rest[0])} adds {format_size(rest_added)}"
    elif rest:
        text += f"; the {len(rest)} other processes ({_roles(rest)}) add {format_size(rest_added)}"
    return text


def _role(row):
    """ "supervisor", "worker", "draining master"."""
    state = row.info.state
    return f"{state} {row.info.role}" if state in ("starting", "draining") else row.info.role


def _roles(rows):
    """ "a supervisor, 2 draining workers": what rows are, counted."""
    counts = collections.Counter(_role(row) for row in rows)
    return ", ".join(f"a {name}" if n == 1 else f"{n} {name}s" for name, n in counts.items())


def breakdown(report):
    """Where the headline's memory is: the master's, what the workers add,
    what they hold alone, and the page cache; None without a master."""
    master = report.master
    if master is None or master.info.role == "single":
        return None
    which = f"the master's (g{master.info.generation})" if master.info.state else "the master's"
    others = "workers" if all(row.info.role == "worker" or row is master
                              for row in report.processes) else "other processes"
    kind = "anonymous memory" if report.ratio_basis == "anonymous" else "memory"
    text = (f"{others} add {format_size(report.workers_cost)} to {which} "
            f"{format_size(report.master_base)} of {kind}; serving workers hold "
            f"{format_size(report.copied)} alone (their own allocations and any pages "
            "copied from the master)")
    if report.ratio_basis == "anonymous":
        text += (f"; file pages {format_size(report.total_pss_file)} (page cache: shared, "
                 "reclaimable)")
    return text


def _summary_lines(report):
    return [line for line in (headline(report), breakdown(report)) if line]


def log_report(logger, report, level=logging.INFO):
    """Log each process's shared, private and file memory, then the summary line."""
    for row in report.processes:
        memory = row.memory
        logger.log(
            level, "Memory of %s (pid %d): RSS %s, PSS %s, shared %s (%.0f%%), private %s, "
            "file %s, swap %s",
            row.info.label, row.info.pid, format_size(memory.rss), format_size(memory.pss),
            format_size(memory.shared), 100 * memory.shared_fraction,
            format_size(memory.private), format_size(memory.file), format_size(memory.swap),
        )
    logger.log(level, "Memory: %s", "; ".join(_summary_lines(report)))


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
    ("private_bytes", "gauge", "memory.private",
     "Anonymous private memory (copies and own allocations): min(Private_Dirty, Anonymous)."),
    ("file_bytes", "gauge", "memory.file",
     "Resident file-backed memory (page cache, reclaimable): Rss - Anonymous."),
    ("uss_bytes", "gauge", "memory.uss",
     "Unique set size: Private_Clean + Private_Dirty (file pages included)."),
    ("shared_clean_bytes", "gauge", "memory.shared_clean", "Shared_Clean from smaps."),
    ("shared_dirty_bytes", "gauge", "memory.shared_dirty", "Shared_Dirty from smaps."),
    ("private_clean_bytes", "gauge", "memory.private_clean", "Private_Clean from smaps."),
    ("private_dirty_bytes", "gauge", "memory.private_dirty", "Private_Dirty from smaps."),
    ("anonymous_bytes", "gauge", "memory.anonymous", "Anonymous from smaps."),
    ("swap_bytes", "gauge", "memory.swap", "Swapped-out memory."),
    ("shared_ratio", "gauge", "memory.shared_fraction", "Shared part of resident memory, 0 to 1."),
    ("start_time_seconds", "gauge", "memory.start_time", "Start time since the Unix epoch."),
    ("minor_faults_total", "counter", "memory.minor_faults", "Minor page faults."),
    ("major_faults_total", "counter", "memory.major_faults", "Major page faults (read from disk)."),
    ("requests_total", "counter", "info.requests", "Requests served."),
    ("connections", "gauge", "info.connections", "Connections the worker holds open."),
    ("gc_collections_total", "counter", "info.gc_collections",
     "Garbage collections in the worker (--worker-gc)."),
    ("gc_pause_seconds_total", "counter", "info.gc_pause",
     "Time the worker spent in garbage collections."),
)

# (name after "<prefix>_", type, attribute of the Report, help)
_SERVER_METRICS = (
    ("server_processes", "gauge", "process_count", "Processes in the server, master included."),
    ("server_pss_bytes", "gauge", "total_pss", "Sum of PSS: what the server costs the machine."),
    ("server_private_bytes", "gauge", "total_private", "Sum of anonymous private memory."),
    ("server_file_pss_bytes", "gauge", "total_pss_file",
     "Sum of Pss_File: the server's share of the page cache (Linux >= 5.13)."),
    ("server_uss_bytes", "gauge", "total_uss", "Sum of USS over the server."),
    ("server_swap_bytes", "gauge", "total_swap", "Sum of swap over the server."),
    ("master_rss_bytes", "gauge", "master_rss",
     "Serving master's RSS: the application in one process."),
    ("workers_cost_bytes", "gauge", "workers_cost",
     "Server Pss_Anon - master Anonymous (PSS - RSS before Linux 5.13): what workers add."),
    ("workers_copied_bytes", "gauge", "copied", "Private memory of the serving workers."),
    ("cost_ratio", "gauge", "cost_ratio",
     "Server Pss_Anon / master Anonymous (PSS / RSS before Linux 5.13); 1: workers are free."),
    ("server_anon_pss_bytes", "gauge", "total_pss_anon", "Sum of Pss_Anon (Linux >= 5.13)."),
)

_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")


def to_prometheus(report, prefix="forkserve"):
    """The report in Prometheus text exposition format 0.0.4.

    Per-process series are keyed by what survives churn: role, worker
    number and generation (forkserve.process.lifecycle: a recycled worker's
    replacement takes its number), so recycles do not start new series; a
    new generation (a reload) does. The pid and state are only in
    ``<prefix>_process_info``. Unknown values (requests, the ratio without
    a master) are left out rather than reported as 0.
    """
    if not _METRIC_NAME.match(prefix):
        raise ValueError(f"prefix {prefix!r} is not a valid Prometheus metric name")
    keys = series_labels([row.info for row in report.processes])
    name = f"{prefix}_process_info"
    out = [f"# HELP {name} One series per process, always 1: its pid and state (serving, "
           "starting, draining), to join with the other series on role, worker and generation.",
           f"# TYPE {name} gauge"]
    for row, key in zip(report.processes, keys):
        extra = [("pid", str(row.info.pid)), ("state", row.info.state or "serving")]
        out.append(f"{name}{{{_format_labels(key + extra)}}} 1")
    for suffix, kind, attribute, help_text in _PROCESS_METRICS:
        name = f"{prefix}_process_{suffix}"
        out += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
        value_of = operator.attrgetter(attribute)
        for row, key in zip(report.processes, keys):
            value = value_of(row)
            if value is not None:
                out.append(f"{name}{{{_format_labels(key)}}} {_number(value)}")
    for suffix, kind, attribute, help_text in _SERVER_METRICS:
        name = f"{prefix}_{suffix}"
        out += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
        value = getattr(report, attribute)
        if value is not None:
            out.append(f"{name} {_number(value)}")
    return "\n".join(out) + "\n"


def series_labels(infos):
    """Each process's series key, [(label, value)], unique within the report.

    role, worker and generation when known. A draining worker shares its
    number with its replacement for as long as it drains: it is told apart
    by state="draining" (the replacement keeps the plain key), and by its
    pid only if that does not tell it apart (two draining workers of one
    number, or workers found by their titles, which do not say who drains).
    """
    keys = [_base_labels(info) for info in infos]
    order = sorted(range(len(infos)), key=lambda i: infos[i].state == "draining")
    seen = set()
    for i in order:
        key = keys[i]
        if tuple(key) in seen and infos[i].state == "draining":
            key = key + [("state", "draining")]
        if tuple(key) in seen:  # titles alone cannot tell which one drains
            key = key + [("pid", str(infos[i].pid))]
        seen.add(tuple(key))
        keys[i] = key
    return keys


def _base_labels(info):
    labels = [("role", info.role)]
    if info.worker_id is not None:
        labels.append(("worker", str(info.worker_id)))
    if info.generation is not None:
        labels.append(("generation", str(info.generation)))
    return labels


def _format_labels(labels):
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
