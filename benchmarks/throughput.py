"""Requests per second beside Granian: PersonDB lookups and hello world.

    python benchmarks/throughput.py                    # 3 rounds x 10 s, 300,000 rows
    python benchmarks/throughput.py --quick            # 1 round x 3 s, 20,000 rows
    python benchmarks/throughput.py --connections 256 --servers granian,forkserve
    python3.12 -m venv .venv312 && .venv312/bin/pip install -e '.[bench]'
    python benchmarks/throughput.py --python .venv312/bin/python   # heap sharing: 3.12+

Four scenarios, every server of one started first and then measured in
rounds, one server after the other within a round (a change in the
machine's load then hits every server alike):

- persondb: examples/persondb (Bottle; --rows people, default 300,000,
  plain dicts unless said), wrk on random lookups (apps/lookup.lua, 5%
  unknown people answered 404, every connection kept alive), 4 workers:
  gunicorn (`--preload -k gevent`), uwsgi (pyuwsgi `--processes 4 --gevent
  1000`; it closes every connection, see the notes), granian (`granian
  --interface wsgi --workers 4`, no preload: each worker loads its own
  copy), forkserve (`-w 4`, plain dicts: its heap sharing is on by default
  on Python 3.12+), forkserve-noyield (the same with --no-yield-cpu: its
  four workers share the CPU by scheduler ticks, not in turns),
  forkserve-geventlocal (the same with --no-c-local: Bottle's request and
  response are gevent's greenlet-locals, not forkserve's C ones),
  forkserve-store (`-w 4`, PERSONDB_MODE=store) and forkserve-w0 (one
  process);
- hello: benchmarks/apps/hello_app.py (13 bytes), GET / on keep-alive
  connections: granian-w1, granian-w4, forkserve-w0, forkserve-w4;
- persondb-close and hello-close: the same applications on a connection
  per request (every request says Connection: close, as behind nginx's
  default proxy_pass or uwsgi_pass): gunicorn, uwsgi, granian and
  forkserve with 4 workers; hello-close also granian-w1 and forkserve-w0.
- tls-keepalive and tls-close: the hello app over https, 2 workers each,
  on one self-signed certificate (RSA 2048, made with the openssl CLI):
  gunicorn (`-k gevent --certfile --keyfile`), uwsgi (the `uwsgi`
  executable beside --python, `pip install uwsgi` built with OpenSSL:
  pyuwsgi's wheels have no `--https-socket`; `--gevent 1000`), granian (`--ssl-certificate --ssl-keyfile`),
  forkserve (`--certfile --keyfile`); tls-keepalive keeps connections
  open, tls-close sends Connection: close with every request, so each
  request is a new connection and a full handshake.

Every server is pinned with taskset to --server-cpus (CPU 0), wrk (one
thread, --connections keep-alive connections, default 64) and this
harness to --client-cpus (CPU 1). After --warmup seconds of unmeasured
load per server, each round loads one server for --duration seconds.

Figures, per server:

- req/s: the median over the rounds of wrk's responses / duration;
- ×granian: req/s over Granian's in the same scenario: on persondb its 4
  workers, on hello Granian with as many workers (granian-w1 for a single
  process), on the TLS scenarios its 2 workers;
- p50, p99: the median over the rounds of wrk's percentiles;
- CPU/req: user + system time of every process of the server's process
  group (/proc/PID/stat), read before and after each round, summed over
  the rounds and divided by their responses; CPU ×granian: over Granian's
  (as ×granian). On a busy machine req/s is partly the neighbours', CPU
  per request much less: compare that;
- PSS: the total PSS of the server's process group (smaps_rollup) after
  its last round.

CPU steal (/proc/stat) over the whole run is printed with the load average,
with a warning above 1%: on a shared VM, req/s is then partly the
neighbours'. Results: --out (benchmarks/results/throughput): result.json
(the harness's schema), results.md (the table and the run's conditions),
and each server's log in logs/.
"""

import argparse
import datetime
import os
import statistics
import sys
import tempfile

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.harness import procs, wrk  # noqa: E402
from benchmarks.harness.datasets import build_store, prepare_dataset  # noqa: E402
from benchmarks.harness.machine import (  # noqa: E402
    Conditions, cpu_list, say, stop_on_signals, versions,
)
from benchmarks.harness.results import (  # noqa: E402
    Result, command_line, render_meta, run_meta, table,
)
from benchmarks.harness.servers import (  # noqa: E402
    HERE, REPO, python_version, throughput_servers,
)
from benchmarks.harness.start import ServerFailed, start_spec  # noqa: E402

DEFAULTS = {"duration": 10, "rounds": 3, "warmup": 2, "rows": 300_000}
DEFAULT_SCENARIOS = ("persondb", "hello", "persondb-close", "hello-close")
QUICK = {"duration": 3, "rounds": 1, "warmup": 1, "rows": 20_000}

#: Seconds a server gets to start: Granian's workers each load the dataset.
START_TIMEOUT = 300.0
#: Above this CPU steal over the run, the table comes with a warning.
STEAL_WARNING = 0.01

#: the columns of the table, printed, in results.md and in the generated pages
RESULT_COLUMNS = (
    ("scenario", "scenario"), ("server", "server"), ("rps", "req/s"),
    ("rps_vs_granian", "×granian", "×"), ("p50_ms", "p50"), ("p99_ms", "p99"),
    ("cpu_us", "CPU/req"), ("cpu_vs_granian", "CPU ×granian", "×"),
    ("pss", "PSS after", "MiB"), ("closed", "closed by server"),
)


def parse_args(argv):
    lineup = throughput_servers()
    names = sorted({spec.name for specs in lineup.values() for spec, _ in specs})
    p = argparse.ArgumentParser(prog="python benchmarks/throughput.py",
                                description=__doc__.splitlines()[0])
    p.add_argument("--python", default=sys.executable,
                   help="the servers' interpreter, with forkserve and the servers installed "
                        "(default: this one)")
    p.add_argument("--quick", action="store_true", help="1 round x 3 s, 20,000 rows")
    p.add_argument("--rounds", type=int, help="rounds per server (default 3, --quick 1)")
    p.add_argument("--duration", type=int, help="seconds per round (default 10, --quick 3)")
    p.add_argument("--warmup", type=int, help="seconds of unmeasured load first (default 2)")
    p.add_argument("--rows", type=int, help="PersonDB people (default 300,000, --quick 20,000)")
    p.add_argument("--connections", type=int, default=64, help="wrk keep-alive connections (64)")
    p.add_argument("--scenarios", default=",".join(DEFAULT_SCENARIOS),
                   help=f"{','.join(DEFAULT_SCENARIOS)} (the default), tls-keepalive, "
                        "tls-close; -close: a connection per request")
    p.add_argument("--servers", default="all",
                   help="comma-separated names, or SCENARIO:NAME: " + ", ".join(names))
    p.add_argument("--server-cpus", default="0", help="taskset CPUs for the servers (0)")
    p.add_argument("--client-cpus", default="1", help="taskset CPUs for wrk and the harness (1)")
    p.add_argument("--seed", type=int, default=1, help="the dataset's seed (1)")
    p.add_argument("--data-dir", default=os.path.join(tempfile.gettempdir(), "forkserve-bench"),
                   help="where the generated dataset is cached")
    p.add_argument("--out", default=os.path.join(HERE, "results", "throughput"),
                   help="results directory (benchmarks/results/throughput)")
    args = p.parse_args(argv)
    for key, value in (QUICK if args.quick else DEFAULTS).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    unknown = sorted(set(args.scenarios) - set(lineup))
    if unknown:
        p.error(f"unknown scenario(s) {', '.join(unknown)}; choose from {', '.join(lineup)}")
    if args.servers != "all":
        wanted = [n.strip() for n in args.servers.split(",") if n.strip()]
        known = set(names) | {f"{s}:{spec.name}" for s, specs in lineup.items()
                              for spec, _ in specs}
        unknown = sorted(set(wanted) - known)
        if unknown:
            p.error(f"unknown server(s) {', '.join(unknown)}; choose from {', '.join(names)}")
        args.servers = wanted
    return args


def selected(args):
    """{scenario: [(spec, workers)]} that the options pick."""
    chosen = {}
    for scenario, specs in throughput_servers().items():
        if scenario not in args.scenarios:
            continue
        chosen[scenario] = [(spec, workers) for spec, workers in specs
                            if args.servers == "all" or spec.name in args.servers
                            or f"{scenario}:{spec.name}" in args.servers]
    return chosen


def heap_sharing_line(log):
    """forkserve's "Heap sharing ..." line in a server log, without its prefix, or None:
    whether the heap was shared is part of what a forkserve row measured."""
    for line in log.decode("utf-8", "replace").splitlines():
        if "[INFO] Heap sharing" in line or "[WARNING] Heap sharing" in line:
            return line[line.index("Heap sharing"):]
    return None


def figures(rounds, pss):
    """One server's figures from its rounds: [(PhaseResult, CPU seconds)]."""
    responses = sum(r.responses for r, _ in rounds)
    return {
        "rps": statistics.median(r.rate for r, _ in rounds),
        "p50_ms": statistics.median(r.p50_us for r, _ in rounds) / 1000,
        "p99_ms": statistics.median(r.p99_us for r, _ in rounds) / 1000,
        "cpu_us": sum(cpu for _, cpu in rounds) / responses * 1e6 if responses else None,
        "pss": pss,
        "errors": sum(r.errors for r, _ in rounds),
        "closed": sum(r.read_errors for r, _ in rounds),
        "responses": responses,
        "rounds_rps": [round(r.rate) for r, _ in rounds],
    }


def add_ratios(rows):
    """Each row's req/s and CPU per request over Granian's: on PersonDB its 4
    workers, on hello world Granian with the same worker count (1 for a single
    process)."""
    rps = {(row["scenario"], row["server"]): row["rps"] for row in rows}
    cpu = {(row["scenario"], row["server"]): row["cpu_us"] for row in rows}
    for row in rows:
        if app_of(row["scenario"]) == "persondb" or row["scenario"].startswith("tls"):
            base = "granian"  # one Granian row: persondb, the TLS scenarios
            base = "granian"
        else:
            base = "granian-w1" if row["workers"] <= 1 else "granian-w4"
        granian = rps.get((row["scenario"], base))
        row["rps_vs_granian"] = row["rps"] / granian if granian else None
        granian_cpu = cpu.get((row["scenario"], base))
        row["cpu_vs_granian"] = (row["cpu_us"] / granian_cpu
                                 if granian_cpu and row["cpu_us"] is not None else None)
    return rows


def app_of(scenario):
    """The application a scenario serves: persondb-close is PersonDB on a
    connection per request."""
    return scenario.removesuffix("-close")


def wrk_env(scenario, emails_path, seed):
    """wrk's script environment: keep-alive connections, or with -close a
    connection per request (every request says Connection: close)."""
    close = scenario.endswith("-close")
    if app_of(scenario) == "persondb":
        # quota 0: lookup.lua counts but never stops
        return {"BENCH_EMAILS": emails_path, "BENCH_QUOTA": "0",
                "BENCH_CLOSE_RATIO": "1" if close else "0", "BENCH_SEED": str(seed)}
    return {"BENCH_CLOSE": "1"} if close else None


def run_scenario(scenario, specs, args, env, log_dir, workdir, py_version, emails_path):
    """Start every server of one scenario, measure them in rounds; (rows, skipped, notes)."""
    skipped, notes, running = [], [], {}
    rows = []
    persondb = app_of(scenario) == "persondb"
    url_path = "/person/" if persondb else "/"
    script = wrk.LUA_SCRIPT if persondb else wrk.HELLO_LUA
    script_env = wrk_env(scenario, emails_path, args.seed)
    try:
        for spec, workers in specs:
            reason = spec.skip_reason(args.python, py_version)
            if reason is None and spec.mode == "store":
                _, problem = build_store(args.python, env["PERSONDB_CSV"], env)
                reason = problem and f"building the Store failed: {problem}"
            if reason:
                say(f"{scenario} {spec.name}: skipped: {reason}")
                skipped.append((f"{scenario}:{spec.name}", reason))
                continue
            server_env = dict(env, PERSONDB_MODE=spec.mode) if spec.mode else env
            try:
                server = start_spec(spec, python=args.python, workers=workers,
                                    log_path=os.path.join(log_dir, f"{scenario}-{spec.name}.log"),
                                    env=server_env, cpus=args.server_cpus,
                                    probe_path="/health" if persondb else "/",
                                    timeout=START_TIMEOUT)
            except ServerFailed as exc:
                say(f"{scenario} {spec.name}: FAILED: {exc}")
                skipped.append((f"{scenario}:{spec.name}", f"failed to start: {exc}"))
                continue
            running[spec.name] = (spec, workers, server, [])
            if spec.note:
                notes.append((f"{scenario}:{spec.name}", spec.note))
            sharing = heap_sharing_line(server.log())
            if sharing:
                notes.append((f"{scenario}:{spec.name}", sharing))
            say(f"{scenario} {spec.name}: ready on port {server.port} "
                f"({len(server.members())} processes)")
        for spec, _, server, _ in running.values():
            wrk.run(server.url + url_path, args.warmup, args.connections, args.client_cpus,
                    workdir, script=script, env=script_env)
        for round_no in range(1, args.rounds + 1):
            for name, (spec, _, server, rounds) in running.items():
                if not server.alive():
                    say(f"{scenario} {name}: died; no more rounds")
                    continue
                before = procs.group_cpu_seconds(server.pid)
                text = wrk.run(server.url + url_path, args.duration, args.connections,
                               args.client_cpus, workdir, script=script, env=script_env)
                cpu = procs.group_cpu_seconds(server.pid) - before
                result = wrk.parse_result(text)
                rounds.append((result, cpu))
                say(f"round {round_no} {scenario} {name}: {result.rate:,.0f} req/s, p99 "
                    f"{result.p99_us / 1000:.2f} ms, CPU {cpu / max(result.responses, 1) * 1e6:.1f}"
                    f" µs/req, {result.errors} errors")
        for name, (spec, workers, server, rounds) in running.items():
            if not rounds:
                continue
            pss = sum(s.pss for s in procs.sample_group(server.pid, spec.single))
            rows.append({"scenario": scenario, "server": name, "description": spec.description,
                         "workers": workers, **figures(rounds, pss)})
    finally:
        for _, _, server, _ in running.values():
            server.stop(grace=10)
    return rows, skipped, notes


def render_markdown(rows, skipped, notes, meta, steal_warning):
    lines = [*render_meta(meta, "throughput beside Granian"),
             *([f"**{steal_warning}**", ""] if steal_warning else []),
             "×granian: req/s over Granian's in the same scenario (persondb, persondb-close: "
             "its 4 workers; hello, hello-close: the same worker count, 1 for -w 0). Definitions: benchmarks/throughput.py's docstring.", "",
             *table(rows, RESULT_COLUMNS), "",
             "Servers:", "", *(f"- `{r['scenario']}:{r['server']}`: {r['description']}, "
                               f"req/s per round {', '.join(map(str, r['rounds_rps']))}"
                               for r in rows), ""]
    if skipped:
        lines += ["## Not measured", "", *(f"- `{name}`: {why}" for name, why in skipped), ""]
    if notes:
        lines += ["## Notes", "", *(f"- `{name}`: {note}" for name, note in notes), ""]
    return "\n".join(lines) + "\n"


def main(argv=None):
    args = parse_args(argv)
    log_dir = os.path.join(args.out, "logs")
    os.makedirs(log_dir, exist_ok=True)
    if args.client_cpus:
        os.sched_setaffinity(0, cpu_list(args.client_cpus))
    py_version = python_version(args.python)
    started_at = datetime.datetime.now(datetime.timezone.utc)
    conditions = Conditions()
    env = dict(os.environ, PYTHONPATH=REPO, PYTHONUNBUFFERED="1")
    lineup = selected(args)
    emails_path = None
    if any(app_of(scenario) == "persondb" for scenario in lineup):
        csv_path, emails_path = prepare_dataset(args.rows, args.seed, args.data_dir)
        env.update(PERSONDB_CSV=csv_path, PERSONDB_STORE=csv_path + ".store")
    rows, skipped, notes = [], [], []
    with stop_on_signals(), tempfile.TemporaryDirectory(prefix="forkserve-tput-") as workdir:
        for scenario, specs in lineup.items():
            found = run_scenario(scenario, specs, args, env, log_dir, workdir, py_version,
                                 emails_path)
            rows += found[0]
            skipped += found[1]
            notes += found[2]
    conditions.end()
    add_ratios(rows)
    steal_warning = (f"CPU steal was {conditions.steal:.1%} during the run (above "
                     f"{STEAL_WARNING:.0%}): req/s is partly the neighbours' on this VM"
                     if conditions.steal > STEAL_WARNING else "")
    found = versions(args.python, extra=("granian",))
    command = command_line("throughput.py", argv)
    title = "throughput beside Granian" + (" (--quick)" if args.quick else "")
    meta = run_meta(
        title, started_at, command, conditions, found,
        load=f"wrk 1 thread, {args.connections} connections (keep-alive; a new one per request "
             f"in the -close scenarios); {args.rounds} round(s) "
             f"x {args.duration} s per server after {args.warmup} s of warm-up; persondb: "
             f"{args.rows:,} rows, random lookups (5% unknown)",
        servers=f"pinned to CPU {args.server_cpus}; wrk and the harness on CPU "
                f"{args.client_cpus}")
    result = Result.measured("throughput.py", command, rows, conditions, title=title,
                             date=meta["date"], versions=found)
    result.write(args.out)
    markdown = render_markdown(rows, skipped, notes, meta, steal_warning)
    with open(os.path.join(args.out, "results.md"), "w", encoding="utf-8") as f:
        f.write(markdown)
    print(markdown)
    if steal_warning:
        say("WARNING: " + steal_warning)
    say(f"{conditions.describe()}\nresults in {args.out}")
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
