"""Compare forkserve with Gunicorn, uWSGI and one gevent process on PersonDB.

    python benchmarks/run.py                 # the full run (< 10 min on 2 cores)
    python benchmarks/run.py --quick         # a smoke run (< 2 min)
    python benchmarks/run.py --servers gunicorn,forkserve-share --rows 100000

The servers (harness/servers.py, persondb_servers), 4 workers each:

- gunicorn: `gunicorn --preload -k gevent -w 4`, plain dicts; every ratio
  is to it;
- gunicorn-gc: the same plus benchmarks/apps/gunicorn.conf.py: gc.disable()
  while loading, gc.freeze() and gc.set_threshold(0) in pre_fork,
  atexit.register(os._exit, 0) in post_fork;
- uwsgi: pyuwsgi `--master --processes 4 --gevent 1000`, the app loaded in
  the master; it runs `--protocol http`, one request per connection,
  because pyuwsgi 2.0.30's gevent loop fails on HTTP/1.1 keep-alive with
  gevent 26 (wrk counts its closes as read errors);
- gevent-single: gevent's WSGIServer in one process (harness/serve_fd.py);
- forkserve-dict, forkserve-share, forkserve-store: `forkserve -w 4` with
  PERSONDB_MODE dict, share (Python 3.12+) or store;
- forkserve-single: `forkserve -w 0`, plain dicts.

For each server in turn: start it in its own process group, pinned with
taskset to --server-cpus (CPU 0) while wrk and this harness run on
--client-cpus (CPU 1), on the same cached PersonDB dataset (loaded once, in
its master); wait until /health answers and every worker is up; sample
/proc/PID/smaps_rollup and /proc/PID/stat of every process of the group;
drive --phases phases of --requests random lookups with wrk, sampling
every 2 s and after each phase; then stop it (SIGTERM, SIGKILL after 20 s)
and time the stop. A server that cannot start here is listed with the
reason; the others still run. The figures are defined in
benchmarks/harness/report.py's docstring.

Choices that keep it fair: the same app, data, worker count and load for
every server, no access log, keep-alive where the server has it. wrk, not
Locust, drives the load: it costs microseconds per request, where Locust's
Python would be what one core measures. Phases are counts of lookups, not
durations, because copy-on-write copies grow with the rows touched, and
comparing after the same time would penalise the faster server. About 2%
of requests carry `Connection: close` (benchmarks/apps/lookup.lua; 5% ask for
unknown people and get 404), so connections are re-accepted and spread
over the workers as a real client population's would be. No port numbers
are handed around: forkserve binds port 0 and logs its port; the others get
a socket bound here (Gunicorn `-b fd://N`, uWSGI socket activation, `--fd`
for gevent). TCP_NODELAY is set on those sockets, as Gunicorn and forkserve
set it on theirs. --budget (570 s, 110 s with --quick) is shared out among
the phases still to run; a phase that hits its time cap serves fewer
lookups, and the table says so.

What copy-on-write copies depends on what a lookup writes. The PersonDB
handler hands Bottle a copy of the row (`dict(row)`), as services do, which
takes a reference to every field: each lookup writes the reference counts
of a row dict and its ~30 strings, and every page holding one is copied
into the worker that served it. The gc recipe (gunicorn-gc) keeps the pages
a collection would write shared, but cannot stop reference counting.
forkserve-share and forkserve-store write no page of the dataset; the
store's pages are the file's, in the page cache once, so its PSS grows with
the pages read, shared by every process.

Results go to --out (benchmarks/results/run): result.json (the harness's
schema, from which benchmarks/README.md and docs/benchmarks.md are
rendered), samples.csv (every process at every sample), summary.csv,
results.md (every figure, per phase too), memory.png, latency.png and
probes.csv (the latency probe, load.LatencyProbe: one lookup at a time on
a new connection alongside wrk, whose own latencies have no time axis), and
each server's log in logs/. Every process started here is stopped on the
way out, also on Ctrl-C or SIGTERM.
"""

import argparse
import contextlib
import datetime
import http.client
import json
import os
import sys
import tempfile
import threading
import time

if __package__ in (None, ""):
    # Run as a script: make the repository (forkserve, examples, benchmarks)
    # importable, as `python -m benchmarks.run` from the root would.
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.harness import report, wrk as load  # noqa: E402
from benchmarks.harness.datasets import build_store, prepare_dataset  # noqa: E402
from benchmarks.harness.machine import (  # noqa: E402
    Conditions, cpu_list, machine, say, stop_on_signals, versions,
)
from benchmarks.harness.procs import sample_group  # noqa: E402
from benchmarks.harness.results import Result, command_line  # noqa: E402
from benchmarks.harness.servers import REPO, persondb_servers, python_version  # noqa: E402
from benchmarks.harness.start import ServerFailed, all_cpus, log_tail, start_spec  # noqa: E402

#: Settings of the default run and of --quick (each overridable by its flag).
#: the figures benchmarks/README.md and docs/benchmarks.md show of a run's
#: rows (benchmarks.harness.index; every figure is in summary.csv and results.md)
RESULT_COLUMNS = (
    ("description", "server"), ("master_rss", "master RSS", "MiB"),
    ("pss_final", "total PSS after the lookups", "MiB"), ("ratio_pss_final", "×gunicorn", "×"),
    ("worker_private", "private per worker", "MiB"), ("worker_file", "file per worker", "MiB"),
    ("rps", "req/s"), ("ratio_rps", "×gunicorn", "×"), ("cpu_us", "CPU per request"),
    ("p50_ms", "p50"), ("p99_ms", "p99"), ("p999_ms", "p99.9"),
)

DEFAULTS = {
    "rows": 300_000, "phases": 4, "requests": 20_000, "phase_timeout": 45.0,
    "workers": 4, "connections": 32, "budget": 570.0,
}
QUICK = {
    "rows": 20_000, "phases": 2, "requests": 5_000, "phase_timeout": 20.0,
    "workers": 4, "connections": 32, "budget": 110.0,
}

#: Seconds set aside per server still to run for starting, settling and
#: stopping it, when the time budget is shared out among the phases.
OVERHEAD_PER_SERVER = 20.0
#: No phase is given less than this, whatever the budget says.
MIN_PHASE_S = 5.0

#: Seconds a server gets to load the dataset and start its workers.
START_TIMEOUT = 180.0
#: Pause after start and after each phase, so in-flight work settles before
#: the sample that counts (wrk's last responses, freed buffers).
SETTLE_S = 1.0


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="python benchmarks/run.py",
        description="Memory and throughput of pre-fork servers serving the PersonDB example.",
    )
    p.add_argument("--quick", action="store_true",
                   help="small dataset and short phases: a smoke test in under 2 minutes")
    p.add_argument("--servers", default="all",
                   help="comma-separated names (default: all): "
                        + ", ".join(s.name for s in persondb_servers()))
    p.add_argument("--rows", type=int, help=f"dataset rows (default {DEFAULTS['rows']:,})")
    p.add_argument("--workers", type=int, help=f"workers per server (default {DEFAULTS['workers']})")
    p.add_argument("--phases", type=int, help=f"load phases (default {DEFAULTS['phases']})")
    p.add_argument("--requests", type=int,
                   help=f"lookups per phase (default {DEFAULTS['requests']:,})")
    p.add_argument("--connections", type=int,
                   help=f"concurrent connections (default {DEFAULTS['connections']})")
    p.add_argument("--phase-timeout", type=float,
                   help=f"time cap per phase, s (default {DEFAULTS['phase_timeout']:.0f})")
    p.add_argument("--budget", type=float,
                   help="seconds the whole run may take; phases are cut short (and flagged) "
                        f"to stay within it (default {DEFAULTS['budget']:.0f}, "
                        f"--quick {QUICK['budget']:.0f})")
    p.add_argument("--seed", type=int, default=0, help="dataset seed (default 0)")
    p.add_argument("--python", default=sys.executable,
                   help="interpreter that runs the servers (default: this one)")
    p.add_argument("--server-cpus", default="0",
                   help="taskset CPU list for the servers ('' = unpinned; default 0)")
    p.add_argument("--client-cpus", default="1",
                   help="taskset CPU list for wrk and this harness ('' = unpinned; default 1)")
    p.add_argument("--sample-interval", type=float, default=2.0,
                   help="seconds between memory samples during a phase (default 2)")
    p.add_argument("--probe-interval", type=float, default=0.05,
                   help="seconds between latency probes during the phases (default 0.05); "
                        "see load.LatencyProbe")
    p.add_argument("--data-dir", default=os.path.join(tempfile.gettempdir(), "forkserve-bench"),
                   help="where the generated dataset is cached (default: %(default)s)")
    p.add_argument("--out", help="results directory (default: benchmarks/results/run, "
                                 "or a temp dir with --quick)")
    args = p.parse_args(argv)
    preset = QUICK if args.quick else DEFAULTS
    for key, value in preset.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.out is None:
        args.out = (os.path.join(tempfile.gettempdir(), "forkserve-bench-quick") if args.quick
                    else os.path.join(REPO, "benchmarks", "results", "run"))
    known = {s.name for s in persondb_servers()}
    if args.servers != "all":
        wanted = [name.strip() for name in args.servers.split(",") if name.strip()]
        unknown = sorted(set(wanted) - known)
        if unknown:
            p.error(f"unknown server(s) {', '.join(unknown)}; choose from {', '.join(sorted(known))}")
        args.servers = wanted
    else:
        args.servers = [s.name for s in persondb_servers()]
    if args.workers < 1:
        p.error("--workers must be >= 1 (the single-process servers are in the list already)")
    return args


# -- one server ---------------------------------------------------------------------


class Sampler:
    """Samples the server's process group every ``interval`` s in a thread."""

    def __init__(self, run, root_pid, single, started, interval):
        self.run, self.root_pid, self.single = run, root_pid, single
        self.started, self.interval = started, interval
        self.phase = 0
        self._stop = threading.Event()
        self._thread = None

    def record(self, point, responses=""):
        now = time.monotonic() - self.started
        for s in sample_group(self.root_pid, self.single):
            self.run.samples.append({
                "server": self.run.name, "phase": self.phase, "point": point,
                "t_s": round(now, 3), "responses": responses, "pid": s.pid, "role": s.role,
                "rss": s.rss, "pss": s.pss, "uss": s.uss,
                "private": s.private, "file": s.file, "shared": s.shared, "swap": s.swap,
                "minor_faults": s.minor_faults, "major_faults": s.major_faults,
                "cpu_s": s.cpu_s,
            })

    @contextlib.contextmanager
    def during(self, phase):
        self.phase = phase
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="sampler", daemon=True)
        self._thread.start()
        try:
            yield
        finally:
            self._stop.set()
            self._thread.join()

    def _loop(self):
        while not self._stop.wait(self.interval):
            self.record("during")


class Budget:
    """Shares the run's remaining time out among the phases still to run."""

    def __init__(self, seconds, phases_per_server, servers):
        self.deadline = time.monotonic() + seconds
        self.phases_per_server = phases_per_server
        self.servers_left = servers

    def phase_cap(self, phase_cap, phases_left_here):
        """Seconds the next phase may take.

        Up to twice its fair share of the time left, so one slow phase
        (another process stole the CPU for a while) still completes, but
        never so much that the phases after it get less than MIN_PHASE_S.
        """
        later = self.servers_left - 1
        phases_left = max(phases_left_here + later * self.phases_per_server, 1)
        spare = self.deadline - time.monotonic() - later * OVERHEAD_PER_SERVER
        cap = min(phase_cap, 2 * spare / phases_left, spare - (phases_left - 1) * MIN_PHASE_S)
        return max(MIN_PHASE_S, cap)

    def server_done(self):
        self.servers_left -= 1


def run_server(spec, args, csv_path, load_spec, env, workdir, budget):
    """Start, load and stop one server; a report.ServerRun."""
    run = report.ServerRun(spec.name, spec.description, note=spec.note)
    log_path = os.path.join(args.out, "logs", f"{spec.name}.log")
    server_env = dict(env, PERSONDB_CSV=csv_path, PERSONDB_MODE=spec.mode,
                      PERSONDB_STORE=csv_path + ".store")
    started = time.monotonic()
    # Always set the server's CPUs: unpinned means all of them, not the
    # client CPUs this harness pinned itself to (children inherit affinity).
    with start_spec(spec, python=args.python, workers=args.workers, log_path=log_path,
                    env=server_env, cwd=workdir, cpus=args.server_cpus or all_cpus(),
                    timeout=START_TIMEOUT) as server:
        port = server.port
        run.startup_s = time.monotonic() - started
        say(f"  ready on port {port} in {run.startup_s:.1f}s "
            f"({len(server.members())} processes)")
        time.sleep(SETTLE_S)
        sampler = Sampler(run, server.pid, spec.single, started, args.sample_interval)
        sampler.record("loaded", 0)
        probe = load.LatencyProbe(port, load.probe_paths(load_spec.emails_path), started,
                                  interval=args.probe_interval)
        responses = 0
        url = f"http://127.0.0.1:{port}"
        for phase in range(1, args.phases + 1):
            with sampler.during(phase), probe:
                cap = budget.phase_cap(args.phase_timeout, args.phases - phase + 1)
                result = load.run_phase(url, load_spec, args.requests, cap,
                                        workdir, phase_id=phase)
            run.phases.append(result)
            responses += result.responses
            if not server.alive():
                raise ServerFailed(f"died during phase {phase}:\n" + log_tail(log_path))
            time.sleep(SETTLE_S)
            sampler.record("phase_end", responses)
            pss = sum(r["pss"] for r in run.samples
                      if r["point"] == "phase_end" and r["phase"] == phase)
            say(f"  phase {phase}: {result.responses:,} responses in {result.duration_s:.1f}s "
                f"({result.rate:,.0f}/s, p99 {result.p99_us / 1000:.1f} ms, "
                f"{result.errors} errors), total PSS {pss / report.MIB:,.0f} MiB"
                + (" [hit the time cap]" if result.timed_out else ""))
        run.probes = probe.records
        stats_port = server.stats_port()
        if stats_port is not None:
            run.worker_requests = worker_requests(stats_port)
        run.stop_s = server.stop()
    return run


def worker_requests(stats_port):
    """{pid: requests served} of the serving processes, from forkserve's stats JSON."""
    conn = http.client.HTTPConnection("127.0.0.1", stats_port, timeout=30)
    try:
        conn.request("GET", "/json")
        report_ = json.loads(conn.getresponse().read())
    except (OSError, http.client.HTTPException, ValueError) as exc:
        say(f"  no per-worker request counts: stats endpoint: {exc!r}")
        return {}
    finally:
        conn.close()
    return {p["pid"]: p["requests"] for p in report_["processes"]
            if p["role"] in ("worker", "single") and p["requests"] is not None}


# -- the whole run ----------------------------------------------------------------


def main(argv=None):
    clock_start = time.monotonic()
    args = parse_args(argv)
    with stop_on_signals():
        runs, meta = run_all(args, argv, clock_start)
    write_results(runs, meta, args.out)
    return 0 if any(run.status == "ok" for run in runs) else 1


def run_all(args, argv, clock_start):
    """Run every selected server in turn; (runs, meta) for the report."""
    if args.client_cpus:
        os.sched_setaffinity(0, cpu_list(args.client_cpus))
    os.makedirs(os.path.join(args.out, "logs"), exist_ok=True)
    py_version = python_version(args.python)
    env = dict(os.environ, PYTHONPATH=REPO, PYTHONUNBUFFERED="1")
    started_at = datetime.datetime.now(datetime.timezone.utc)
    conditions = Conditions()
    csv_path, emails_path = prepare_dataset(args.rows, args.seed, args.data_dir)
    load_spec = load.LoadSpec(emails_path=emails_path, connections=args.connections,
                              cpus=args.client_cpus or None)
    runs = []
    specs = [s for s in persondb_servers() if s.name in args.servers]
    budget = Budget(args.budget - (time.monotonic() - clock_start), args.phases, len(specs))
    with tempfile.TemporaryDirectory(prefix="forkserve-bench-") as workdir:
        for spec in specs:
            try:
                runs.append(run_one(spec, args, csv_path, load_spec, env, workdir, budget,
                                    py_version))
            finally:
                budget.server_done()
    found = versions(args.python)
    meta = run_meta(args, argv, found, csv_path, started_at, conditions.end())
    meta["result"] = Result.measured(
        "run.py", command_line("run.py", argv), report.summary_rows(runs), conditions,
        title=meta["title"], date=meta["date"], versions=found)
    return runs, meta


def run_one(spec, args, csv_path, load_spec, env, workdir, budget, py_version):
    """One server's ServerRun: measured, skipped (can't run here) or failed."""
    reason = spec.skip_reason(args.python, py_version)
    if reason is None and spec.mode == "store":
        seconds, problem = build_store(args.python, csv_path, env)
        if problem:
            reason = f"building the Store failed: {problem}"
        else:
            say(f"store cache ready ({seconds:.1f}s)")
    if reason:
        say(f"{spec.name}: skipped: {reason}")
        return report.ServerRun(spec.name, spec.description, status="skipped", reason=reason)
    say(f"{spec.name}: {spec.description}")
    try:
        return run_server(spec, args, csv_path, load_spec, env, workdir, budget)
    except ServerFailed as exc:
        say(f"{spec.name}: FAILED: {exc}")
        first_line = str(exc).splitlines()[0]
        return report.ServerRun(spec.name, spec.description, status="failed",
                                reason=f"{first_line} (see logs/{spec.name}.log)")


def run_meta(args, argv, found_versions, csv_path, started_at, conditions):
    size_mb = os.path.getsize(csv_path) / 1e6
    return {
        "title": "PersonDB lookups" + (" (--quick)" if args.quick else ""),
        "date": started_at.strftime("%Y-%m-%d %H:%M UTC"),
        "command": f"`{command_line('run.py', argv)}`",
        "machine": machine() + "; " + conditions.describe(),
        "versions": ", ".join(f"{k} {val}" for k, val in found_versions.items()),
        "dataset": f"{args.rows:,} people, CSV {size_mb:,.0f} MB (seed {args.seed})",
        "load": (f"{args.phases} phases × {args.requests:,} random lookups (5% unknown → 404), "
                 f"wrk {load_spec_text(args)}"),
        "servers": f"{args.workers} workers each (except the single-process ones), pinned to "
                   f"CPU {args.server_cpus or 'any'}; wrk and the harness on CPU "
                   f"{args.client_cpus or 'any'}",
    }


def load_spec_text(args):
    return (f"1 thread, {args.connections} connections, ~2% of requests with "
            f"'Connection: close'; time cap {args.phase_timeout:.0f}s per phase")


def write_results(runs, meta, out):
    meta.pop("result").write(out)
    with open(os.path.join(out, "samples.csv"), "w", newline="") as f:
        report.write_samples_csv(runs, f)
    with open(os.path.join(out, "summary.csv"), "w", newline="") as f:
        report.write_summary_csv(runs, f)
    with open(os.path.join(out, "probes.csv"), "w", newline="") as f:
        report.write_probes_csv(runs, f)
    markdown = report.render_markdown(runs, meta)
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write(markdown)
    try:
        for name, plot in (("memory.png", report.plot), ("latency.png", report.plot_latency)):
            png = os.path.join(out, name)
            plot(runs, png, f"{meta['dataset']}; {meta['load']}")
            say(f"plot: {png}")
    except ImportError as exc:
        say(f"no plot ({exc}); pip install matplotlib")
    print(markdown)
    say(f"results in {out}")


if __name__ == "__main__":
    sys.exit(main())
