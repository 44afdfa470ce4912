"""Hello world on every WSGI server that runs here: the servers' own cost.

    python benchmarks/hello.py                  # 3 rounds x 10 s per server
    python benchmarks/hello.py --quick          # 1 round x 3 s: a smoke run
    python benchmarks/hello.py --servers forkserve-w0,gevent-pywsgi --out /tmp/h
    python benchmarks/hello.py --servers forkserve-w0,forkserve-w4 --contend 2 --out /tmp/hc

Every server serves benchmarks/apps/hello_app.py (13 bytes, one start_response,
no framework), pinned with taskset to --server-cpus (default CPU 0); wrk,
pinned to --client-cpus (default CPU 1), keeps --connections (default 64)
keep-alive connections busy with GET /. All servers are started first and
then measured in rounds, one server after the other within a round, so a
change in the machine's load hits every server alike rather than the last
ones. An idle server costs next to nothing while another one is measured.
With --contend N, N busy-looping processes share the server CPUs through
the warm-up and the rounds (CPU contention, as from other work on the
machine; a VM's steal cannot be made from inside it).

Figures (per server; "the server" is every process of its process group):

- req/s: the median over the rounds of responses / wrk's measured duration.
- p50, p99, p99.9: the median over the rounds of wrk's percentiles (wrk
  records every request's latency at 1 us resolution, so each round's
  percentiles are exact; across rounds they cannot be merged, hence the
  median).
- CPU/req: utime + stime (from /proc/PID/stat, 10 ms ticks) of every process
  of the server's group, read just before wrk starts and just after it ends,
  summed over the rounds and divided by the responses of those rounds. It
  includes the kernel's work for the server's sockets that is charged to
  the server (its syscalls; most of loopback TCP processing runs in the
  sender's context and is shared with wrk's CPU).
- app/req: the CPU time of calling the same app in a loop inside one plain
  Python process (same interpreter, same CPU, no server): the app call, a
  no-op start_response, iterating the body and closing it, with a fixed
  environ like a server's. Median of 5 batches.
- server overhead/req: CPU/req - app/req. What the server spends per
  request that the app does not: accept, reading and parsing, building the
  environ, start_response, framing and sending, its event loop, bookkeeping.

Ratios are to `gunicorn` (Gunicorn -k gevent -w 4) and to `gevent-pywsgi`
(gevent's WSGIServer alone). The servers are in harness/servers.py
(hello_servers); meinheld is listed as not measured (its last release pins
greenlet<0.5, which does not build on Python 3.11+). Results:
--out (benchmarks/results/hello): result.json (the harness's schema),
results.md, summary.csv (one row per server) and rounds.csv (one row per
round), and each server's log.
"""

import argparse
import contextlib
import csv
import dataclasses
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.harness import procs, wrk  # noqa: E402
from benchmarks.harness.machine import (  # noqa: E402
    Conditions, cpu_list, say, stop_on_signals, versions,
)
from benchmarks.harness.results import (  # noqa: E402
    Result, command_line, render_meta, run_meta, table,
)
from benchmarks.harness.servers import (  # noqa: E402
    HELLO_APP as APP, HERE, REPO, hello_servers, keepalive_problem, python_version,
    uwsgi_fallback,
)
from benchmarks.harness.start import ServerFailed, all_cpus, start_spec  # noqa: E402

#: the figures benchmarks/README.md shows of a run's rows (all are in summary.csv)
RESULT_COLUMNS = (
    ("server", "server"), ("rps", "req/s (median)"), ("rps_vs_gunicorn", "×gunicorn", "×"),
    ("rps_vs_gevent-pywsgi", "×gevent", "×"), ("p99_ms", "p99"), ("p999_ms", "p99.9"),
    ("cpu_us", "CPU/req"), ("overhead_us", "server overhead/req"),
    ("overhead_vs_gevent-pywsgi", "overhead ×gevent", "×"), ("closed", "closed by server"),
    ("rounds_rps", "req/s per round"),
)

DEFAULTS = {"duration": 10, "rounds": 3, "warmup": 2}
QUICK = {"duration": 3, "rounds": 1, "warmup": 1}

#: Seconds a server gets to start and answer.
START_TIMEOUT = 60.0


# -- measuring --------------------------------------------------------------------------


APP_COST_CODE = r"""
import importlib, json, statistics, sys, time
module, _, attr = sys.argv[1].partition(":")
app = getattr(importlib.import_module(module), attr)
environ = {
    "REQUEST_METHOD": "GET", "SCRIPT_NAME": "", "PATH_INFO": "/", "QUERY_STRING": "",
    "SERVER_NAME": "127.0.0.1", "SERVER_PORT": "8000", "SERVER_PROTOCOL": "HTTP/1.1",
    "REMOTE_ADDR": "127.0.0.1", "REMOTE_PORT": "50000", "HTTP_HOST": "127.0.0.1:8000",
    "wsgi.version": (1, 0), "wsgi.url_scheme": "http", "wsgi.input": None,
    "wsgi.errors": sys.stderr, "wsgi.multithread": True, "wsgi.multiprocess": False,
    "wsgi.run_once": False,
}
def write(data):
    pass
def start_response(status, headers, exc_info=None):
    return write
def once():
    result = app(environ, start_response)
    try:
        for chunk in result:
            pass
    finally:
        close = getattr(result, "close", None)
        if close is not None:
            close()
n = int(sys.argv[2])
for _ in range(n):
    once()
batches = []
for _ in range(5):
    started = time.process_time()
    for _ in range(n):
        once()
    batches.append((time.process_time() - started) / n * 1e6)
print(json.dumps({"app_us": statistics.median(batches), "batches_us": batches}))
"""


def app_cost_us(python, cpus, calls=200_000):
    """CPU microseconds per call of the app alone, on the servers' CPU (see the docstring)."""
    argv = ["taskset", "-c", cpus] if cpus else []
    argv += [python, "-c", APP_COST_CODE, APP, str(calls)]
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=REPO))
    if proc.returncode != 0:
        raise RuntimeError("measuring the app's own cost failed:\n" + proc.stderr[-2000:])
    return json.loads(proc.stdout)["app_us"]


def start(spec, args, log_dir, env, probe_path="/"):
    """Start one server; a harness Server once GET probe_path answers 200 and
    all its processes exist. Raises ServerFailed if it does not come up."""
    return start_spec(spec, python=args.python, workers=args.workers,
                      log_path=os.path.join(log_dir, f"{spec.name}.log"), env=env,
                      cpus=args.server_cpus or all_cpus(), probe_path=probe_path,
                      timeout=START_TIMEOUT)


def parse_args(argv):
    names = [s.name for s in hello_servers()]
    p = argparse.ArgumentParser(prog="python benchmarks/hello.py",
                                description="Hello-world req/s, latency and CPU per request "
                                            "of every WSGI server that runs here.")
    p.add_argument("--quick", action="store_true", help="1 round of 3 s per server")
    p.add_argument("--servers", default="all", help="comma-separated: " + ", ".join(names))
    p.add_argument("--duration", type=int, help="seconds per round (default 10, --quick 3)")
    p.add_argument("--rounds", type=int, help="rounds per server (default 3, --quick 1)")
    p.add_argument("--warmup", type=int, help="seconds of unmeasured load first (default 2)")
    p.add_argument("--connections", type=int, default=64, help="keep-alive connections (64)")
    p.add_argument("--workers", type=int, default=4, help="processes of pre-fork servers (4)")
    p.add_argument("--python", default=sys.executable, help="the servers' interpreter")
    p.add_argument("--server-cpus", default="0", help="taskset CPUs for the servers (0)")
    p.add_argument("--client-cpus", default="1", help="taskset CPUs for wrk and the harness (1)")
    p.add_argument("--contend", type=int, default=0, metavar="N",
                   help="N busy-looping processes on the server CPUs during the rounds (0)")
    p.add_argument("--out", help="results directory (default benchmarks/results/hello, "
                                 "or a temp dir with --quick)")
    args = p.parse_args(argv)
    for key, value in (QUICK if args.quick else DEFAULTS).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.out is None:
        args.out = (os.path.join(tempfile.gettempdir(), "forkserve-hello-quick") if args.quick
                    else os.path.join(HERE, "results", "hello"))
    if args.servers == "all":
        args.servers = names
    else:
        args.servers = [n.strip() for n in args.servers.split(",") if n.strip()]
        unknown = sorted(set(args.servers) - set(names))
        if unknown:
            p.error(f"unknown server(s) {', '.join(unknown)}; choose from {', '.join(names)}")
    return args


#: Ratios are given to each of these servers.
BASELINES = ("gunicorn", "gevent-pywsgi")


@dataclasses.dataclass(frozen=True)
class Round:
    """One wrk run against one server: wrk's figures and the server's CPU seconds."""

    server: str
    round: int
    wrk: wrk.PhaseResult
    cpu_s: float


def parse_wrk(stdout, server, round_no, cpu_s):
    """The Round from hello.lua's BENCH_RESULT line."""
    return Round(server, round_no, wrk.parse_result(stdout), cpu_s)


def figures(rounds, app_us):
    """One server's headline figures from its rounds (None = n/a)."""
    responses = sum(r.wrk.responses for r in rounds)
    cpu_us = sum(r.cpu_s for r in rounds) / responses * 1e6 if responses else None
    return {
        "rps": statistics.median(r.wrk.rate for r in rounds) if rounds else None,
        "p50_ms": statistics.median(r.wrk.p50_us for r in rounds) / 1000 if rounds else None,
        "p99_ms": statistics.median(r.wrk.p99_us for r in rounds) / 1000 if rounds else None,
        "p999_ms": statistics.median(r.wrk.p999_us for r in rounds) / 1000 if rounds else None,
        "cpu_us": cpu_us,
        "app_us": app_us,
        "overhead_us": cpu_us - app_us if cpu_us is not None and app_us is not None else None,
        "errors": sum(r.wrk.errors for r in rounds),
        "closed": sum(r.wrk.read_errors for r in rounds),
        "responses": responses,
        "rounds_rps": [round(r.wrk.rate) for r in rounds],
    }


def _ratio(value, base):
    return value / base if value is not None and base else None


def summary(results, app_us):
    """[{server, description, figures..., ratio_rps_<baseline>...}] for servers that ran."""
    rows = []
    figs = {name: figures(rounds, app_us) for name, (_, rounds) in results.items() if rounds}
    for name, (description, rounds) in results.items():
        if not rounds:
            continue
        row = {"server": name, "description": description, **figs[name]}
        for base in BASELINES:
            row[f"rps_vs_{base}"] = _ratio(row["rps"], figs.get(base, {}).get("rps"))
            row[f"overhead_vs_{base}"] = _ratio(row["overhead_us"],
                                                figs.get(base, {}).get("overhead_us"))
        rows.append(row)
    return rows


#: the columns of results.md: every figure of a row
PAGE_COLUMNS = (
    ("server", "server"), ("rps", "req/s"), ("rps_vs_gunicorn", "×gunicorn", "×"),
    ("rps_vs_gevent-pywsgi", "×gevent", "×"), ("p50_ms", "p50"), ("p99_ms", "p99"),
    ("p999_ms", "p99.9"), ("cpu_us", "CPU/req"), ("app_us", "app/req"),
    ("overhead_us", "server overhead/req"), ("overhead_vs_gunicorn", "overhead ×gunicorn", "×"),
    ("overhead_vs_gevent-pywsgi", "overhead ×gevent", "×"), ("errors", "errors"),
    ("closed", "closed by server"), ("rounds_rps", "req/s per round"),
)


def render_markdown(rows, skipped, notes, meta):
    """results.md: the run's context, every figure of every server, what did not run."""
    lines = [*render_meta(meta, "hello world"),
             "Ratios: req/s and server overhead relative to `gunicorn` and to `gevent-pywsgi` "
             "(— when that server did not run). Definitions: benchmarks/hello.py's docstring.",
             "", *table(rows, PAGE_COLUMNS), ""]
    if skipped:
        lines += ["## Not measured", "", *(f"- `{name}`: {reason}" for name, reason in skipped),
                  ""]
    if notes:
        lines += ["## Notes", "", *(f"- `{name}`: {note}" for name, note in notes), ""]
    return "\n".join(lines) + "\n"


def main(argv=None):
    args = parse_args(argv)
    os.makedirs(os.path.join(args.out, "logs"), exist_ok=True)
    if args.client_cpus:
        os.sched_setaffinity(0, cpu_list(args.client_cpus))
    with stop_on_signals():
        results, skipped, notes, app_us, meta = run_all(args, argv)
    rows = summary(results, app_us)
    result = meta.pop("result")
    result.rows = rows
    result.write(args.out)
    with open(os.path.join(args.out, "summary.csv"), "w", newline="") as f:
        fields = [k for k in rows[0] if k != "rounds_rps"] if rows else ["server"]
        writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore",
                                lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    with open(os.path.join(args.out, "rounds.csv"), "w", newline="") as f:
        fields = ["server", "round", "cpu_s"]
        fields += [field.name for field in dataclasses.fields(wrk.PhaseResult)]
        writer = csv.DictWriter(f, fieldnames=fields, lineterminator="\n")
        writer.writeheader()
        for _, rounds in results.values():
            writer.writerows({"server": r.server, "round": r.round, "cpu_s": r.cpu_s,
                              **dataclasses.asdict(r.wrk)} for r in rounds)
    markdown = render_markdown(rows, skipped, notes, meta)
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(markdown)
    print(markdown)
    say(f"results in {args.out}")
    return 0 if rows else 1


def run_all(args, argv):
    env = dict(os.environ, PYTHONPATH=REPO, PYTHONUNBUFFERED="1")
    py_version = python_version(args.python)
    started_at = datetime.datetime.now(datetime.timezone.utc)
    conditions = Conditions()
    skipped, notes, running = [], [], {}
    results = {}
    app_us = app_cost_us(args.python, args.server_cpus)
    say(f"the app alone: {app_us:.2f} µs per call")
    log_dir = os.path.join(args.out, "logs")
    try:
        for spec in [s for s in hello_servers() if s.name in args.servers]:
            reason = spec.skip_reason(args.python, py_version)
            if reason:
                say(f"{spec.name}: skipped: {reason}")
                skipped.append((spec.name, f"{spec.note or 'not importable here'}: {reason}"))
                continue
            try:
                server = start(spec, args, log_dir, env)
                problem = keepalive_problem(server.port) if spec.name == "uwsgi" else None
                if problem:
                    server.stop(grace=5)
                    spec = uwsgi_fallback(problem)
                    server = start(spec, args, log_dir, env)
            except ServerFailed as exc:
                say(f"{spec.name}: FAILED: {exc}")
                skipped.append((spec.name, f"failed to start: {exc}"))
                continue
            if spec.note and spec.name != "bjoern":
                notes.append((spec.name, spec.note))
            running[spec.name] = server
            results[spec.name] = (spec.description, [])
            say(f"{spec.name}: ready on port {server.port} ({len(server.members())} processes)")
        with tempfile.TemporaryDirectory(prefix="forkserve-hello-") as workdir, \
                contention(args.contend, args.server_cpus, log_dir):
            for server in running.values():
                wrk.run(server.url + "/", args.warmup, args.connections, args.client_cpus,
                        workdir)
            for round_no in range(1, args.rounds + 1):
                for name, server in running.items():
                    if not server.alive():
                        say(f"{name}: died; no more rounds")
                        continue
                    before = procs.group_cpu_seconds(server.pid)
                    text = wrk.run(server.url + "/", args.duration, args.connections,
                                   args.client_cpus, workdir)
                    cpu = procs.group_cpu_seconds(server.pid) - before
                    r = parse_wrk(text, name, round_no, cpu)
                    results[name][1].append(r)
                    per_req = cpu / max(r.wrk.responses, 1) * 1e6
                    say(f"round {round_no} {name}: {r.wrk.rate:,.0f} req/s, p99 "
                        f"{r.wrk.p99_us / 1000:.2f} ms, CPU {per_req:.1f} µs/req, "
                        f"{r.wrk.errors} errors, {r.wrk.read_errors} closed")
    finally:
        for server in running.values():
            server.stop(grace=10)
    conditions.end()
    found = versions(args.python, extra=("waitress", "cheroot", "bjoern"))
    command = command_line("hello.py", argv)
    meta = run_meta(
        "hello world" + (" (--quick)" if args.quick else ""), started_at, command, conditions,
        found,
        load=f"wrk 1 thread, {args.connections} keep-alive connections, GET / on "
             f"{APP}; {args.rounds} round(s) x {args.duration} s per server after "
             f"{args.warmup} s of warm-up",
        servers=f"pinned to CPU {args.server_cpus or 'any'}; wrk and the harness on CPU "
                f"{args.client_cpus or 'any'}; pre-fork servers run {args.workers} "
                "workers on that one CPU"
                + (f"; {args.contend} busy-looping process(es) on the server CPU "
                   "through the rounds (--contend)" if args.contend else ""))
    meta["result"] = Result.measured("hello.py", command, [], conditions, title=meta["title"],
                                     date=meta["date"], versions=found)
    return results, skipped, notes, app_us, meta


@contextlib.contextmanager
def contention(count, cpus, log_dir):
    """`count` busy-looping processes pinned to `cpus` while the block runs."""
    hogs = []
    try:
        for _ in range(count):
            hogs.append(procs.Group(["taskset", "-c", cpus, sys.executable, "-c",
                                     "while True: pass"],
                                    log_path=os.path.join(log_dir, "contend.log")))
        yield
    finally:
        for hog in hogs:
            hog.stop(grace=5)


if __name__ == "__main__":
    sys.exit(main())
