"""The memory report as JSON, and back.

The report itself (who is in the server, and the definitions of RSS, PSS,
private and file memory) is forkserve.memory.model; reading /proc is
forkserve.memory.procfs; the table, log lines and Prometheus text are
forkserve.memory.render. This module turns a Report into JSON (served by the
stats endpoint and read back by ``forkserve memory --stats``) and back. The
command itself is forkserve.memory.command.
"""

from forkserve.memory import procfs
from forkserve.memory.model import ProcessInfo, ProcessRow, Report
from forkserve.memory.procfs import ProcessMemory

__all__ = ["JSON_SCHEMA", "from_json", "to_json"]

#: Version of the to_json() layout. Keys are only ever added; a change that
#: breaks readers bumps this, and from_json() refuses what it cannot read.
JSON_SCHEMA = 1

_SIZES = tuple(attribute for _, attribute in procfs.MEMORY_FIELDS)

# -- JSON -------------------------------------------------------------------


def to_json(report):
    """The report as JSON-ready data. Sizes in bytes, times in seconds::

        {"schema": 1,
         "time": epoch seconds of the reading,
         "processes": [{"pid", "role", "worker_id", "generation", "state",
                        "requests", "gc_collections", "gc_pause",
                        "connections", "accepted", "start_time", "uptime",
                        "rss", "pss", "shared_clean", "shared_dirty",
                        "private_clean", "private_dirty", "swap",
                        "anonymous", "pss_anon", "pss_file",
                        "private", "file", "uss", "shared", "shared_fraction",
                        "minor_faults", "major_faults"}, ...],
         "totals": {"processes", "workers", "rss", "pss", "uss", "private",
                    "file", "pss_file", "swap", "master_rss", "ratio_basis",
                    "master_base", "total_base", "workers_cost",
                    "copied", "cost_ratio", "minor_faults", "major_faults",
                    "requests", "gc_collections", "gc_pause"}}

    "private" is anonymous private memory (what --max-worker-memory limits)
    and "file" resident file-backed memory; forkserve.memory.model defines
    both. state is "serving", "starting" or "draining" under a supervisor.
    gc_collections and gc_pause (seconds) are a worker's own garbage
    collections (--worker-gc). connections is a worker's open connections
    and accepted the connections it has taken (forkserve.process.balance
    spreads them). cost_ratio = total_base / master_base, on
    anonymous memory or, before Linux 5.13, on all (ratio_basis; see
    forkserve.memory.model). Unknown values are null: worker_id,
    generation, state, requests, gc_*, connections, accepted (when the caller does not know them);
    master_rss, master_base, workers_cost, cost_ratio (when there is no
    master). "private", "file", "uss", "shared",
    "shared_fraction" and "totals" are derived, for readers' convenience;
    from_json() recomputes them.
    """
    processes = []
    for row in report.processes:
        info, memory = row.info, row.memory
        entry = {
            "pid": info.pid,
            "role": info.role,
            "worker_id": info.worker_id,
            "generation": info.generation,
            "state": info.state,
            "requests": info.requests,
            "gc_collections": info.gc_collections,
            "gc_pause": info.gc_pause,
            "connections": info.connections,
            "accepted": info.accepted,
            "start_time": memory.start_time,
            "uptime": row.uptime,
        }
        entry.update((name, getattr(memory, name)) for name in _SIZES)
        entry.update(
            private=memory.private,
            file=memory.file,
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
        "private": report.total_private,
        "file": report.total_file,
        "pss_file": report.total_pss_file,
        "swap": report.total_swap,
        "master_rss": report.master_rss,
        "ratio_basis": report.ratio_basis,
        "master_base": report.master_base,
        "total_base": report.total_base,
        "workers_cost": report.workers_cost,
        "copied": report.copied,
        "cost_ratio": report.cost_ratio,
        "minor_faults": report.minor_faults,
        "major_faults": report.major_faults,
        "requests": report.requests,
        "gc_collections": report.gc_collections,
        "gc_pause": report.gc_pause,
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
        state=entry.get("state"),
        gc_collections=_optional_int(entry.get("gc_collections")),
        gc_pause=None if entry.get("gc_pause") is None else float(entry["gc_pause"]),
        connections=_optional_int(entry.get("connections")),
        accepted=_optional_int(entry.get("accepted")),
    )
    sizes = {name: int(entry.get(name, 0)) for name in _SIZES}
    sizes["anonymous"] = int(entry.get("anonymous", sizes["rss"]))  # as procfs does
    memory = ProcessMemory(
        pid=info.pid,
        minor_faults=int(entry["minor_faults"]),
        major_faults=int(entry["major_faults"]),
        start_time=float(entry["start_time"]),
        **sizes,
    )
    return ProcessRow(info, memory, float(entry["uptime"]))


def _optional_int(value):
    return None if value is None else int(value)


