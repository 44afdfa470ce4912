"""Turn a benchmark's samples into figures, ratios, CSV, markdown and a plot.

Everything here except :func:`plot` is pure: the harness hands over plain
records, tests hand over made-up ones.

Definitions (per server, "workers" meaning every process that serves
requests: the forked workers, or the one process of a server that does not
fork):

- master RSS: the root process's RSS once the app is loaded, before any
  request; what the dataset costs in one process.
- total PSS: the sum of PSS over the server's processes; what the server
  costs the machine (shared pages are divided among their users).
- worker USS: mean of Private_Clean + Private_Dirty over the workers at the
  end: what each worker maps alone, file pages included.
- worker private: mean over the workers at the end of their anonymous
  private memory, min(Private_Dirty, Anonymous): the memory copy-on-write
  copied (and new allocations). worker file: mean resident file-backed
  memory (Rss - Anonymous), shared through the page cache and reclaimable.
- shared: mean over the workers of (RSS - USS) / RSS at the end.
- CoW faults: mean minor page faults per worker during the load phases
  (a copy-on-write copy is a minor fault; so is first touch of new memory).
- req/s: responses over the summed phase durations; p50 is the median of
  the phases' p50s, p99 and p99.9 the worst phase's (wrk reports
  percentiles per run and they cannot be merged exactly).
- CPU/req: CPU time (user + system) of all the server's processes during
  the phases, per response. Unlike req/s it hardly depends on what else
  runs on the machine, so it is the fairer efficiency figure on a shared
  host.
- errors: statuses other than 200/404, connect/write errors and timeouts.
- balance: per serving process, the CPU seconds it used during the phases
  (every server) and the requests it served (forkserve's stats endpoint;
  n/a for the others); "max/mean" is the busiest process's figure over the
  mean, 1.00 being perfectly even.
- probe p50/p99/max: latencies of benchmarks.harness.wrk.LatencyProbe's lookups
  (one at a time, at most one every 50 ms, each on a new connection,
  alongside wrk), the same samples
  plotted over time in latency.png; "probe failures" counts probes that got
  no answer within its timeout.
"""

import csv
import dataclasses
import io
import statistics
import textwrap

from benchmarks.harness.results import render_meta

__all__ = [
    "BASELINE",
    "SAMPLE_FIELDS",
    "ServerRun",
    "figures",
    "ratio",
    "render_markdown",
    "summary_rows",
    "write_samples_csv",
    "write_summary_csv",
]

#: The server every ratio is relative to.
BASELINE = "gunicorn"

MIB = 1024 * 1024

SAMPLE_FIELDS = (
    "server", "phase", "point", "t_s", "responses", "pid", "role",
    "rss", "pss", "uss", "private", "file", "shared", "swap", "minor_faults", "major_faults", "cpu_s",
)


@dataclasses.dataclass
class ServerRun:
    """What the harness recorded for one server."""

    name: str
    description: str
    status: str = "ok"  # "ok", "skipped" or "failed"
    reason: str = ""
    note: str = ""
    startup_s: float | None = None
    stop_s: float | None = None
    #: Dicts with SAMPLE_FIELDS keys (sizes in bytes).
    samples: list = dataclasses.field(default_factory=list)
    #: benchmarks.harness.wrk.PhaseResult-like objects, in order.
    phases: list = dataclasses.field(default_factory=list)
    #: LatencyProbe records: (seconds since start, latency s, status or 0).
    probes: list = dataclasses.field(default_factory=list)
    #: {pid: requests served} per serving process, where the server reports it.
    worker_requests: dict = dataclasses.field(default_factory=dict)


def _points(run, point):
    """{phase: [sample rows]} for samples taken at ``point``."""
    by_phase = {}
    for row in run.samples:
        if row["point"] == point:
            by_phase.setdefault(row["phase"], []).append(row)
    return by_phase


def _serving(rows):
    """The rows of the processes that serve requests."""
    workers = [r for r in rows if r["role"] in ("worker", "single")]
    return workers


def total_pss_by_phase(run):
    """[(cumulative responses, total PSS bytes)] at load and after each phase."""
    points = []
    loaded = _points(run, "loaded").get(0)
    if loaded:
        points.append((0, sum(r["pss"] for r in loaded)))
    for phase, rows in sorted(_points(run, "phase_end").items()):
        points.append((rows[0]["responses"], sum(r["pss"] for r in rows)))
    return points


def mean_worker_private_by_phase(run):
    """[(cumulative responses, mean worker private bytes)], like total_pss_by_phase."""
    points = []
    loaded = _points(run, "loaded").get(0)
    if loaded and _serving(loaded):
        points.append((0, statistics.fmean(r["private"] for r in _serving(loaded))))
    for phase, rows in sorted(_points(run, "phase_end").items()):
        if _serving(rows):
            points.append((rows[0]["responses"],
                           statistics.fmean(r["private"] for r in _serving(rows))))
    return points


def figures(run):
    """The headline figures of one completed run, as a dict (None = n/a)."""
    loaded = _points(run, "loaded").get(0, [])
    ends = _points(run, "phase_end")
    final = ends[max(ends)] if ends else []
    root = [r for r in loaded if r["role"] in ("master", "single")]
    workers_end = _serving(final)
    workers_start = {r["pid"]: r for r in _serving(loaded)}
    faults = [
        r["minor_faults"] - workers_start[r["pid"]]["minor_faults"]
        for r in workers_end if r["pid"] in workers_start
    ]
    shared = [(r["rss"] - r["uss"]) / r["rss"] for r in workers_end if r["rss"]]
    single = any(r["role"] == "single" for r in loaded)
    cpu_start = sum(r["cpu_s"] for r in loaded)
    cpu_end = sum(r["cpu_s"] for r in final)
    phases = run.phases
    duration = sum(p.duration_s for p in phases)
    responses = sum(p.responses for p in phases)
    pss_points = total_pss_by_phase(run)
    return {
        "master_rss": root[0]["rss"] if root else None,
        "pss_loaded": sum(r["pss"] for r in loaded) if loaded else None,
        "pss_final": pss_points[-1][1] if len(pss_points) > 1 else None,
        "worker_uss": statistics.fmean(r["uss"] for r in workers_end) if workers_end else None,
        "worker_private": _mean_of(workers_end, "private"),
        "worker_file": _mean_of(workers_end, "file"),
        "shared": None if single or not shared else statistics.fmean(shared),
        "cow_faults": statistics.fmean(faults) if faults else None,
        "rps": responses / duration if duration else None,
        "cpu_us": (cpu_end - cpu_start) / responses * 1e6 if responses and final else None,
        "p50_ms": statistics.median(p.p50_us for p in phases) / 1000 if phases else None,
        "p99_ms": max(p.p99_us for p in phases) / 1000 if phases else None,
        "p999_ms": max(p.p999_us for p in phases) / 1000 if phases else None,
        "errors": sum(p.errors for p in phases) if phases else None,
        "closed": sum(p.read_errors for p in phases) if phases else None,
        "responses": responses,
        "startup_s": run.startup_s,
        "stop_s": run.stop_s,
        "timed_out_phases": sum(1 for p in phases if p.timed_out),
    }


def _mean_of(rows, key):
    return statistics.fmean(r[key] for r in rows) if rows else None


def worker_cpu_seconds(run):
    """{pid: CPU seconds during the phases} of each serving process that lived
    from the loaded sample to the last one."""
    loaded = {r["pid"]: r["cpu_s"] for r in _serving(_points(run, "loaded").get(0, []))}
    ends = _points(run, "phase_end")
    final = _serving(ends[max(ends)]) if ends else []
    return {r["pid"]: r["cpu_s"] - loaded[r["pid"]] for r in final if r["pid"] in loaded}


def spread(values):
    """max / mean of ``values``: 1.0 is perfectly even; None if there is nothing to compare."""
    values = list(values)
    if len(values) < 2 or not sum(values):
        return None
    return max(values) / statistics.fmean(values)


def percentile(values, q):
    """The q-th percentile (0-100) by nearest rank; None for no values."""
    ordered = sorted(values)
    if not ordered:
        return None
    rank = max(1, -(-len(ordered) * q // 100))
    return ordered[int(rank) - 1]


def balance_and_probes(run):
    """Per-process balance and the probe's latency figures of one run."""
    cpu = worker_cpu_seconds(run)
    answered = [latency for _, latency, status in run.probes if status]
    requests = run.worker_requests
    return {
        "cpu_per_worker": [round(v, 1) for v in sorted(cpu.values(), reverse=True)],
        "cpu_spread": spread(cpu.values()),
        "requests_per_worker": sorted(requests.values(), reverse=True) if requests else None,
        "requests_spread": spread(requests.values()) if requests else None,
        "probes": len(run.probes),
        "probe_failures": len(run.probes) - len(answered),
        "probe_p50_ms": _ms(percentile(answered, 50)),
        "probe_p99_ms": _ms(percentile(answered, 99)),
        "probe_max_ms": _ms(max(answered) if answered else None),
    }


def _ms(seconds):
    return None if seconds is None else seconds * 1000


def ratio(value, base):
    """value / base, or None when either is missing or base is zero."""
    if value is None or base is None or base == 0:
        return None
    return value / base


# -- rendering ------------------------------------------------------------------

#: (figure key, column title, formatter, show ratio to the baseline)
COLUMNS = (
    ("master_rss", "master RSS", lambda v: f"{v / MIB:,.0f} MiB", True),
    ("pss_loaded", "PSS before", lambda v: f"{v / MIB:,.0f} MiB", True),
    ("pss_final", "PSS after", lambda v: f"{v / MIB:,.0f} MiB", True),
    ("worker_private", "private/worker", lambda v: f"{v / MIB:,.0f} MiB", True),
    ("worker_file", "file/worker", lambda v: f"{v / MIB:,.0f} MiB", True),
    ("shared", "shared", lambda v: f"{v:.0%}", True),
    ("cow_faults", "faults/worker", lambda v: f"{v:,.0f}", True),
    ("rps", "req/s", lambda v: f"{v:,.0f}", True),
    ("cpu_us", "CPU/req", lambda v: f"{v:,.0f} µs", True),
    ("p50_ms", "p50", lambda v: f"{v:.1f} ms", True),
    ("p99_ms", "p99", lambda v: f"{v:.1f} ms", True),
    ("p999_ms", "p99.9", lambda v: f"{v:.1f} ms", True),
    ("errors", "errors", lambda v: f"{v:,}", False),
)


def _cell(value, base, fmt, with_ratio):
    if value is None:
        return "—"
    text = fmt(value)
    r = ratio(value, base) if with_ratio else None
    return f"{text} ({r:.2f}×)" if r is not None else text


def summary_rows(runs):
    """One dict per completed run: its figures plus ratio_<key> columns."""
    done = [run for run in runs if run.status == "ok"]
    base = next((figures(r) for r in done if r.name == BASELINE), {})
    rows = []
    for run in done:
        figs = figures(run)
        row = {"server": run.name, "description": run.description, **figs}
        for key, value in balance_and_probes(run).items():
            row[key] = " ".join(map(str, value)) if isinstance(value, list) else value
        for key, _, _, with_ratio in COLUMNS:
            if with_ratio:
                row[f"ratio_{key}"] = ratio(figs[key], base.get(key))
        rows.append(row)
    return rows


def render_markdown(runs, meta):
    """The results page: context, the main table, PSS per phase, skips."""
    out = io.StringIO()
    w = out.write
    w("\n".join(render_meta(meta, "PersonDB lookups")) + "\n")
    done = [run for run in runs if run.status == "ok"]
    base = next((figures(r) for r in done if r.name == BASELINE), {})
    if done:
        w(f"Ratios in parentheses are to `{BASELINE}`"
          f"{'' if base else ' (did not run, so no ratios)'}; "
          "lower is better for memory and latency, higher for req/s.\n\n")
        w("| server | " + " | ".join(title for _, title, _, _ in COLUMNS) + " |\n")
        w("|---|" + "---:|" * len(COLUMNS) + "\n")
        for run in done:
            figs = figures(run)
            cells = [_cell(figs[key], base.get(key), fmt, wr) for key, _, fmt, wr in COLUMNS]
            w(f"| `{run.name}` | " + " | ".join(cells) + " |\n")
        w("\n")
        _render_phases(w, done)
        _render_balance(w, done)
        _render_timings(w, done)
    skipped = [run for run in runs if run.status != "ok"]
    if skipped:
        w("## Not measured\n\n")
        for run in skipped:
            w(f"- `{run.name}` ({run.status}): {run.reason}\n")
        w("\n")
    notes = [run for run in runs if run.note]
    if notes:
        w("## Notes\n\n")
        for run in notes:
            w(f"- `{run.name}`: {run.note}\n")
        w("\n")
    return out.getvalue()


def _render_phases(w, runs):
    series = {run.name: total_pss_by_phase(run) for run in runs}
    width = max(len(points) for points in series.values())
    if width < 2:
        return
    w("Total PSS (MiB) after the dataset loaded and after each load phase "
      "(cumulative responses in brackets):\n\n")
    w("| server | " + " | ".join(
        "loaded" if i == 0 else f"phase {i}" for i in range(width)) + " |\n")
    w("|---|" + "---:|" * width + "\n")
    for name, points in series.items():
        cells = [f"{pss / MIB:,.0f} [{responses:,}]" for responses, pss in points]
        cells += ["—"] * (width - len(cells))
        w(f"| `{name}` | " + " | ".join(cells) + " |\n")
    w("\n")


def _render_balance(w, runs):
    w("Balance over the serving processes (busiest first; max/mean 1.00 = even) and the "
      "latency probe (one lookup at a time, at most every 50 ms, on a new connection, "
      "alongside wrk; "
      "latency.png plots every probe):\n\n")
    w("| server | requests per process | max/mean | CPU s per process | max/mean | "
      "probes | probe p50 | probe p99 | probe max | probe failures |\n")
    w("|---|---|---:|---|---:|---:|---:|---:|---:|---:|\n")
    for run in runs:
        b = balance_and_probes(run)

        def num(value, fmt):
            return "—" if value is None else fmt.format(value)

        requests = ("n/a (no per-worker counts)" if b["requests_per_worker"] is None
                    else ", ".join(f"{n:,}" for n in b["requests_per_worker"]))
        w(f"| `{run.name}` | {requests} | {num(b['requests_spread'], '{:.2f}')} | "
          f"{', '.join(map(str, b['cpu_per_worker'])) or '—'} | "
          f"{num(b['cpu_spread'], '{:.2f}')} | {b['probes']:,} | "
          f"{num(b['probe_p50_ms'], '{:.1f} ms')} | {num(b['probe_p99_ms'], '{:.1f} ms')} | "
          f"{num(b['probe_max_ms'], '{:.1f} ms')} | {b['probe_failures']:,} |\n")
    w("\n")


def _render_timings(w, runs):
    w("| server | start (s) | stop (s) | responses | closed by server | phases hitting the time cap |\n")
    w("|---|---:|---:|---:|---:|---:|\n")
    for run in runs:
        f = figures(run)
        start = "—" if f["startup_s"] is None else f"{f['startup_s']:.1f}"
        stop = "—" if f["stop_s"] is None else f"{f['stop_s']:.1f}"
        w(f"| `{run.name}` | {start} | {stop} | {f['responses']:,} | "
          f"{f['closed'] or 0:,} | {f['timed_out_phases']} |\n")
    w("\n")


def write_samples_csv(runs, stream):
    writer = csv.DictWriter(stream, fieldnames=SAMPLE_FIELDS, lineterminator="\n")
    writer.writeheader()
    for run in runs:
        for row in run.samples:
            writer.writerow(row)


def write_summary_csv(runs, stream):
    rows = summary_rows(runs)
    skipped = [
        {"server": run.name, "description": run.description, "status": run.status,
         "reason": run.reason}
        for run in runs if run.status != "ok"
    ]
    fields = ["server", "description", "status", "reason"]
    for row in rows:
        row.setdefault("status", "ok")
        row.setdefault("reason", "")
        fields += [key for key in row if key not in fields]
    writer = csv.DictWriter(stream, fieldnames=fields, lineterminator="\n", restval="")
    writer.writeheader()
    for row in rows + skipped:
        writer.writerow(row)


def write_probes_csv(runs, stream):
    writer = csv.writer(stream, lineterminator="\n")
    writer.writerow(["server", "t_s", "latency_s", "status"])
    for run in runs:
        for record in run.probes:
            writer.writerow([run.name, *record])


def plot_latency(runs, path, title):
    """Every probe's latency against time, one panel per server, same axes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = [run for run in runs if run.status == "ok" and run.probes]
    if not done:
        return
    columns = 2
    rows = -(-len(done) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(13, 2.6 * rows + 0.8), squeeze=False,
                             sharex=True, sharey=True)
    answered = [lat for run in done for _, lat, status in run.probes if status]
    top = max(answered) * 1000 * 1.5 if answered else 1000
    for axis, run in zip(axes.flat, done):
        ok = [(t, lat * 1000) for t, lat, status in run.probes if status]
        failed = [t for t, _, status in run.probes if not status]
        first = run.probes[0][0]
        axis.plot([t - first for t, _ in ok], [lat for _, lat in ok], ".", markersize=2,
                  alpha=0.6)
        if failed:
            axis.plot([t - first for t in failed], [top / 1.2] * len(failed), "x",
                      color="red", markersize=4, label="no answer")
            axis.legend(fontsize=7, loc="upper right")
        b = balance_and_probes(run)
        axis.set_title(f"{run.name}: probe p50 {b['probe_p50_ms']:.1f} ms, "
                       f"p99 {b['probe_p99_ms']:.1f} ms", fontsize=9)
        axis.set_yscale("log")
        axis.set_ylim(0.1, top)
        axis.grid(True, alpha=0.3)
    for axis in axes.flat[len(done):]:
        axis.set_visible(False)
    for axis in axes[-1]:
        axis.set_xlabel("seconds since the first probe (gaps: between phases)")
    for axis in axes[:, 0]:
        axis.set_ylabel("latency (ms)")
    fig.suptitle(textwrap.fill("Latency of probe lookups (one at a time, at most every 50 ms, new "
                               "connection each) alongside wrk's load. "
                               + title, 140), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot(runs, path, title):
    """Total PSS and mean worker private memory against responses served, one line per server."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = [run for run in runs if run.status == "ok"]
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5.6))
    for index, run in enumerate(done):
        color = colors[index % len(colors)]  # the same in both panels
        single = any(r["role"] == "single" for r in run.samples)
        panels = [(left, total_pss_by_phase(run))]
        if not single:
            # A one-process server's "worker" is the whole process: leave it
            # out, so the panel shows what forking costs per worker.
            panels.append((right, mean_worker_private_by_phase(run)))
        for axis, points in panels:
            if points:
                xs = [x / 1000 for x, _ in points]
                ys = [y / MIB for _, y in points]
                style = "--" if run.name.startswith(("gunicorn", "uwsgi", "gevent")) else "-"
                axis.plot(xs, ys, style, marker="o", markersize=4, label=run.name, color=color)
    left.set_title("Total PSS of the server (what it costs the machine)")
    right.set_title("Mean private (anonymous) memory per worker, pre-fork servers")
    for axis in (left, right):
        axis.set_xlabel("responses served (thousands)")
        axis.set_ylabel("MiB")
        axis.grid(True, alpha=0.3)
        axis.set_ylim(bottom=0)
    left.legend(fontsize=8)
    right.legend(fontsize=8)
    fig.suptitle(textwrap.fill(title, 140), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
