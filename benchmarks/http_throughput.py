"""Requests per second of forkserve's HTTP path, two source trees side by side.

    python benchmarks/http_throughput.py --tree this=. --quick    # 1 round x 2 s
    git worktree add /tmp/fs-before HEAD~1     # a "before" tree: any commit
    python benchmarks/http_throughput.py --tree before=/tmp/fs-before --tree after=. \
        --rounds 3 --duration 5
    python benchmarks/http_throughput.py --tree before=/tmp/fs-before --tree after=. \
        --together --apps hello --rounds 12 --duration 3 --workers 4
    python benchmarks/http_throughput.py --tree w0=. --tree w4=. --workers 0,4 --together \
        --apps persondb --mode share --rows 300000 --rounds 4 --duration 10
    python benchmarks/http_throughput.py --gunicorn --tree forkserve=. --workers 4 --together \
        --apps persondb --rows 300000 --rounds 4 --duration 10

(benchmarks/throughput.py is the comparison with Granian, Gunicorn and
uWSGI; this one compares forkserve source trees: before and after a change.)

For each round and each tree it starts `python -m forkserve -w N` (default
-w 0) from that tree, pinned to CPU 0, and runs wrk pinned to CPU 1 against
two apps:

  hello     a WSGI hello world (one 13-byte body, Content-Length set)
  persondb  examples.persondb (PERSONDB_MODE --mode, default dict, for every
            server, Gunicorn's too; --rows people, default 2,000),
            GET /person/<email>, one person after the other in file order,
            or picked at random with --random (as run.py's lookups are)

By default the trees take turns within a round. With --together both trees'
servers run at once and one wrk per tree loads them at the same instants:
the kernel splits CPU 0 evenly between two busy servers, so the ratio of
their req/s is the inverse ratio of their CPU cost per request, measured
under the same conditions. On a shared VM that is the steadier figure:
servers measured one after the other a minute apart differ by up to a
third (benchmarks/accesslog.py has both methods: --method in-turn and
together). Two servers alternating on one CPU evict
each other's caches, which adds to both; read the ratio, not the req/s.

It prints req/s and the server's CPU time per request (user + system, from
/proc/PID/stat) per tree, the after/before ratios of the medians (with
--together also the median and range of the per-round ratios), and the CPU
steal seen during the run (from /proc/stat): a steal above a few percent
means the ratios are not worth trusting.
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import urllib.request
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.harness import wrk  # noqa: E402
from benchmarks.harness.machine import Conditions, add_common_options, parse_quick  # noqa: E402
from benchmarks.harness.procs import group_cpu_seconds  # noqa: E402
from benchmarks.harness.start import start as start_server  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent

HELLO = textwrap.dedent('''
    def app(environ, start_response):
        start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", "13")])
        return [b"Hello, world!"]
''')

LUA = textwrap.dedent('''
    local emails = {}
    for line in io.lines(os.getenv("BENCH_EMAILS")) do emails[#emails + 1] = line end
    local i = 0
    local random = os.getenv("BENCH_RANDOM") == "1"
    math.randomseed(1)  -- every wrk picks the same people in the same order
    request = function()
        if random then i = math.random(#emails) else i = i % #emails + 1 end
        return wrk.format("GET", "/person/" .. emails[i])
    end
''')


QUICK = {"rounds": 1, "duration": 2}


def start(tree, app, env, log_path, workers=0, probe_path="/", python=sys.executable):
    """forkserve from `tree`; with tree None, Gunicorn (--preload -k gevent)
    on this checkout's app, which logs "Listening at" as forkserve does."""
    server = (["forkserve"] if tree is not None
              else ["gunicorn", "--preload", "-k", "gevent", "-c", os.devnull, "--timeout", "120",
                    "--keep-alive", "5", "--worker-connections", "1000"])  # as run.py runs it
    tree = tree if tree is not None else ROOT
    environment = dict(os.environ, PYTHONPATH=f"{tree}:{env.pop('EXTRA_PATH')}",
                       PYTHONUNBUFFERED="1", **env)
    return start_server([python, "-m", *server, "-w", str(workers), "-b", "127.0.0.1:0",
                         app], log_path=log_path, env=environment, cwd=tree, cpus="0",
                        processes=1 + workers, probe_path=probe_path)


def wrk_result(text):
    """(req/s, requests) from what a plain wrk run printed; exits if wrk saw errors."""
    summary = wrk.parse_summary(text)
    if summary.failed:
        raise SystemExit(f"wrk saw errors:\n{text}")
    return summary.rate, summary.requests


def measure(servers, app, path, args, work, emails):
    """{tree name: (req/s, CPU us per request)}, loading `servers` (name:
    harness Server) at once; give one to measure it alone."""
    cpu = {}
    for name, server in servers.items():
        urllib.request.urlopen(server.url + path).read()
        cpu[name] = group_cpu_seconds(server.pid)
    if app == "persondb":
        script, env = str(work / "lookup.lua"), {"BENCH_EMAILS": str(emails),
                                                 "BENCH_RANDOM": str(int(args.random))}
        urls = {name: server.url + "/" for name, server in servers.items()}
    else:
        script, env = None, None
        urls = {name: server.url + path for name, server in servers.items()}
    outputs = wrk.together(list(urls.values()), args.duration, args.connections, "1",
                           str(work), script=script, env=env)
    measured = {}
    for name, server in servers.items():
        rate, count = wrk_result(outputs[urls[name]])
        used = group_cpu_seconds(server.pid) - cpu[name]
        measured[name] = (rate, used * 1e6 / count)
    return measured


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gunicorn", action="store_true",
                        help="also run Gunicorn (--preload -k gevent) on the same app, named "
                             "gunicorn, first: the ratios are then to it")
    parser.add_argument("--tree", action="append", required=True, metavar="NAME=PATH",
                        help="a forkserve source tree to measure (give two: before and after)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=int, default=5, help="seconds of wrk per measurement")
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--apps", default="hello,persondb", help="comma-separated: hello,persondb")
    parser.add_argument("--workers", default="0",
                        help="forkserve -w (default 0); or one per tree, comma-separated, "
                             "to compare worker counts: --tree w0=. --tree w4=. --workers 0,4")
    parser.add_argument("--random", action="store_true",
                        help="persondb: look people up in random order, not file order")
    parser.add_argument("--mode", default="dict", choices=("dict", "share", "store"),
                        help="PERSONDB_MODE of the persondb app (default dict)")
    parser.add_argument("--rows", type=int, default=2000,
                        help="people in the persondb app's data (default 2,000)")
    parser.add_argument("--together", action="store_true",
                        help="load both trees' servers at once instead of in turn")
    add_common_options(parser, QUICK)
    args = parse_quick(parser, argv, QUICK)
    trees = {"gunicorn": None} if args.gunicorn else {}
    trees.update(t.split("=", 1) for t in args.tree)
    workers = [int(w) for w in args.workers.split(",")]
    if len(workers) not in (1, len(trees)):
        parser.error("--workers takes one count, or one per server (--gunicorn's first)")
    workers = dict(zip(trees, workers * len(trees) if len(workers) == 1 else workers))
    work = Path(tempfile.mkdtemp(prefix="http-throughput-"))
    (work / "hello_app.py").write_text(HELLO)
    (work / "lookup.lua").write_text(LUA)
    rows = work / "rows.csv"
    emails = work / "emails.txt"
    apps = {"hello": ("hello_app:app", "/", {}),
            "persondb": ("examples.persondb.app:app", "/health", {"PERSONDB_MODE": args.mode,
                                                           "PERSONDB_CSV": str(rows)})}
    for extra, path in (([], rows), (["--emails"], emails)):
        subprocess.run([sys.executable, "-m", "examples.persondb.generate",
                        "--rows", str(args.rows), "-o", str(path), *extra], cwd=ROOT, check=True)
    apps = {name: apps[name] for name in args.apps.split(",")}
    results = {(name, app): [] for name in trees for app in apps}
    conditions = Conditions()
    ratios = {app: [] for app in apps}
    names = list(trees)
    for round_ in range(args.rounds):
        for app, (spec, path, env) in apps.items():
            groups = [names] if args.together else [[name] for name in names]
            for group in groups:
                servers = {}
                try:
                    for name in group:
                        tree = trees[name] and Path(trees[name]).resolve()
                        servers[name] = start(tree, spec,
                                              dict(env, EXTRA_PATH=f"{work}:{ROOT}"),
                                              work / f"{name}.log", workers[name], path,
                                              args.python)
                    measured = measure(servers, app, path, args, work, emails)
                finally:
                    for server in servers.values():
                        server.stop()
                for name, (rate, micros) in measured.items():
                    results[name, app].append((rate, micros))
                    print(f"round {round_ + 1} {app:9} {name:8} {rate:10.0f} req/s "
                          f"{micros:7.1f} CPU us/request", flush=True)
            if args.together:
                ratios[app].append(results[names[-1], app][-1][0] / results[names[0], app][-1][0])
    print(f"\n{conditions.describe()}")
    for app in apps:
        for i, unit in ((0, "req/s"), (1, "CPU us/request")):
            medians = {name: statistics.median(r[i] for r in results[name, app]) for name in names}
            line = "  ".join(f"{name} {medians[name]:.1f}" for name in names)
            ratio = medians[names[-1]] / medians[names[0]]
            print(f"{app:9} median {unit}: {line}  ratio {names[-1]}/{names[0]} {ratio:.3f}")
        if ratios[app]:
            print(f"{app:9} loaded together, {names[-1]}/{names[0]} req/s per round: median "
                  f"{statistics.median(ratios[app]):.3f} (rounds {min(ratios[app]):.3f}-"
                  f"{max(ratios[app]):.3f}): cost per request "
                  f"{1 / statistics.median(ratios[app]):.3f}x; -w {args.workers}")


if __name__ == "__main__":
    main()
