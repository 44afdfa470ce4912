"""How evenly 4 workers share keep-alive connections: forkserve against Gunicorn.

    python benchmarks/balance.py                       # 4, 8, 16, 64 connections x 8 s
    python benchmarks/balance.py --quick               # 8, 64 connections x 3 s
    git worktree add /tmp/main main                    # a tree to compare with
    python benchmarks/balance.py --also before=/tmp/main --rounds 3
    python benchmarks/balance.py --also "race=. --no-balance"
    python benchmarks/balance.py --connections 64 --perf --also "race=. --no-balance" \
        --also "two=. -w 2" --also "two-race=. -w 2 --no-balance"

Every server runs benchmarks/apps/balance_app.py (a small JSON lookup) with 4
workers on all CPUs (forkserve pins each worker to one of them when the
workers outnumber the CPUs, its --cpu-affinity auto; `--also "unpinned=.
--cpu-affinity off"` measures it without). For each connection count, wrk (one thread,
hello.lua: GET / on keep-alive connections) runs against each server in
turn, opening its connections afresh; --rounds repeats that, and the
summary gives each figure's median over the rounds. Per worker:

- requests: forkserve's, from each worker's process title ("N req"), read
  before and after the run once the titles have caught up (a worker
  refreshes its title once a heartbeat, <= 1 s);
- CPU: utime + stime from /proc/PID/stat (10 ms ticks), before and after,
  for every server (Gunicorn shows no request count). "worker CPU µs/req"
  is the workers' CPU over wrk's responses: on a machine whose other work
  decides how much CPU the server gets (req/s then swings from run to
  run), it says whether the server itself got slower.

`--locust SECONDS` also runs examples/locustfile.py (PersonDB, its demo
dataset) with 10 users for that long, through the Locust plugin
(forkserve.integrations.locust) that starts forkserve -w 4 from this tree,
once as it is and once with --no-balance (workers racing on accept(), the
accept loop before forkserve.process.balance); requests per worker are the
plugin's last stats-endpoint sample.

- context switches: voluntary + involuntary, from /proc/PID/status, per
  response;
- from /proc/PID/schedstat (the scheduler's own accounting of the main
  thread, where the event loop runs): "worker µs on a CPU per turn", the
  workers' CPU time over the times the kernel put them on a CPU (how long
  a worker runs before it sleeps or is preempted), and "runnable wait
  µs/req", the time the workers spent ready to run but waiting for a CPU,
  over wrk's responses;
- with --perf, the workers' epoll_wait() calls (perf stat, the
  syscalls:sys_enter_epoll_wait tracepoint), given as responses per loop
  wake: how many requests a worker's gevent loop serves each time it wakes.
  A worker holding fewer connections finds fewer ready at each wake and
  pays the wake (syscall, loop pass, often a process switch) for fewer.

"busiest/mean" is the busiest worker's requests (CPU for Gunicorn) over the
mean of the workers; 1.00 is perfectly even, 4.00 is one of 4 doing everything.
`--also "NAME=TREE [ARGS]"` adds forkserve-NAME: forkserve imported from
TREE (a checkout, e.g. `git archive main | tar -x -C TREE`; copy the built
forkserve/memory/_immortal*.so into it) with ARGS added, so the code
before a change, or another mechanism, is measured in the same run; `-w N`
in ARGS runs that variant with N workers instead of 4 (`--also "two=. -w 2"`:
is a cost the balance's, or that of more busy workers than CPUs?). Every
server runs with `python -P` (no current directory on sys.path) and
PYTHONPATH=TREE:benchmarks/apps/. The machine's load average and CPU steal
(from /proc/stat) over the run are printed with the table; result.json
(benchmarks/harness/results.py) holds the summary rows.
"""

import argparse
import contextlib
import csv
import datetime
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.harness import procs, wrk  # noqa: E402
from benchmarks.harness.machine import Conditions, say, stop_on_signals  # noqa: E402
from benchmarks.harness.results import Result, command_line  # noqa: E402
from benchmarks.harness.servers import HERE, REPO, ServerSpec  # noqa: E402
from benchmarks.harness.start import start_spec  # noqa: E402

__all__ = ["busiest_ratio", "parse_variant", "perf_count", "requests_from_title",
           "split_workers", "summarize"]

APP = "balance_app:app"  # APPS is on PYTHONPATH
APPS = os.path.join(HERE, "apps")
WORKERS = 4
_TITLE_REQUESTS = re.compile(rb"worker \d+ .*?(\d+) req")
EPOLL_WAIT = "syscalls:sys_enter_epoll_wait"


def _forkserve(extra):
    def command(python, workers, fd):
        return [python, "-P", "-m", "forkserve", "-w", str(workers), "-b", "127.0.0.1:0",
                *extra, APP]
    return command


def _gunicorn(python, workers, fd):
    return [python, "-P", "-m", "gunicorn", "-k", "gevent", "-w", str(workers),
            "-b", f"fd://{fd}", "-c", os.devnull, "--keep-alive", "5",
            "--worker-connections", "1000", APP]


def parse_variant(text):
    """"NAME=TREE [ARGS...]" -> (name, tree, [args])."""
    name, sep, rest = text.partition("=")
    words = shlex.split(rest)
    if not sep or not name or not words:
        raise argparse.ArgumentTypeError(f"--also {text!r}: give NAME=TREE [ARGS], e.g. "
                                         "'before=/tmp/main' or 'race=. --no-balance'")
    return name, os.path.abspath(words[0]), words[1:]


def split_workers(args):
    """(workers, the other ARGS): a variant's `-w N` / `--workers N` taken out
    of its arguments (WORKERS if it has none)."""
    workers, rest, words = WORKERS, [], iter(args)
    for word in words:
        if word in ("-w", "--workers"):
            value = next(words, "")
        elif word.startswith("--workers="):
            value = word.partition("=")[2]
        else:
            rest.append(word)
            continue
        if not value.isdigit() or int(value) < 1:
            raise argparse.ArgumentTypeError(f"--also: {word} {value!r} is not a worker "
                                             "count; give a whole number, e.g. -w 2")
        workers = int(value)
    return workers, rest


def servers(variants):
    """[(ServerSpec, tree, workers)]: forkserve from this tree, each variant, Gunicorn."""
    fork = ("import forkserve.cli",)
    specs = [(ServerSpec("forkserve", f"forkserve -w {WORKERS} (this tree)", "", _forkserve([]),
                         requires=fork, needs_fd=False), REPO, WORKERS)]
    for name, tree, extra in variants:
        workers, extra = split_workers(extra)
        specs.append((ServerSpec(f"forkserve-{name}", f"forkserve -w {workers} "
                                 f"{shlex.join(extra)} ({tree})", "", _forkserve(extra),
                                 requires=fork, needs_fd=False), tree, workers))
    specs.append((ServerSpec("gunicorn", f"gunicorn -k gevent -w {WORKERS}", "", _gunicorn,
                             requires=("import gunicorn", "import gevent")), REPO, WORKERS))
    return specs


def requests_from_title(cmdline):
    """The request count in a forkserve worker's title, or None if it is not one."""
    found = _TITLE_REQUESTS.search(cmdline)
    return int(found.group(1)) if found else None


def perf_count(csv_text, event=EPOLL_WAIT):
    """The count of `event` in `perf stat -x,` output (None if not counted)."""
    for line in csv_text.splitlines():
        fields = line.split(",")
        if len(fields) > 2 and fields[2] == event and fields[0].strip().isdigit():
            return int(fields[0])
    return None


def busiest_ratio(values):
    """The largest value over the mean (None if all are zero)."""
    mean = sum(values) / len(values) if values else 0
    return max(values) / mean if mean else None


def workers(server):
    """The worker pids of a server: those titled as forkserve workers, or
    else every process of its group but the master (Gunicorn's)."""
    pids = [pid for pid in server.members() if pid != server.pid]
    titled = [pid for pid in pids if requests_from_title(procs.cmdline(pid)) is not None]
    return titled or pids


def readings(pids):
    """{pid: (requests or None, CPU seconds, context switches, schedstat)} for
    each worker."""
    return {pid: (requests_from_title(procs.cmdline(pid)), procs.cpu_seconds(pid) or 0.0,
                  procs.context_switches(pid), procs.schedstat(pid)) for pid in pids}


def settled_readings(pids, timeout=5.0):
    """readings() once two of them 1.1 s apart agree (the titles lag a heartbeat)."""
    last = readings(pids)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        time.sleep(1.1)
        now = readings(pids)
        if [r[0] for r in now.values()] == [r[0] for r in last.values()]:
            return now
        last = now
    return last


class LoopWakes:
    """perf stat counting the workers' epoll_wait() calls while it is open."""

    def __init__(self, pids, workdir):
        self.path = os.path.join(workdir, "perf-stat.csv")
        self.proc = subprocess.Popen(
            ["perf", "stat", "-x,", "-e", EPOLL_WAIT, "-o", self.path,
             "-p", ",".join(map(str, pids))], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.count = None

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.proc.send_signal(signal.SIGINT)  # perf stat writes its counts on SIGINT
        _, err = self.proc.communicate(timeout=30)
        try:
            with open(self.path) as f:
                self.count = perf_count(f.read())
        except FileNotFoundError:
            pass
        if self.count is None:
            raise RuntimeError(f"perf stat counted no {EPOLL_WAIT}: {err.decode().strip()!r}; "
                               "run as root (or lower kernel.perf_event_paranoid), or drop --perf")


def measure(name, server, connections, seconds, workdir, perf=False):
    pids = workers(server)
    # perf starts before the idle readings: it then counts a few idle wakes
    # (timers) rather than miss busy ones while it attaches
    wakes = LoopWakes(pids, workdir) if perf else None
    with wakes or contextlib.nullcontext():
        before = settled_readings(pids)
        out = wrk.run(f"{server.url}/", seconds, connections, None, workdir)
    after = settled_readings(pids)
    result = wrk.parse_result(out)
    requests = [after[p][0] - before[p][0] for p in pids
                if after[p][0] is not None and before[p][0] is not None]
    cpu = [after[p][1] - before[p][1] for p in pids]
    return {"server": name, "connections": connections, "rps": result.rate,
            "responses": result.responses,
            "switches": sum(after[p][2] - before[p][2] for p in pids),
            "schedstat": [sum(after[p][3][i] - before[p][3][i] for p in pids) for i in range(3)],
            "wakes": wakes and wakes.count,
            "p99_ms": result.p99_us / 1000, "errors": result.errors,
            "requests": requests if len(requests) == len(pids) else None, "cpu": cpu}


def summarize(rows):
    """Per (connections, server): the medians over the rounds of req/s, p99 and
    the busiest/mean ratios, in first-seen order."""
    groups = {}
    for r in rows:
        groups.setdefault((r["connections"], r["server"]), []).append(r)
    out = []
    for (connections, server), group in groups.items():
        def median(values):
            values = [v for v in values if v is not None]
            return statistics.median(values) if values else None
        out.append({"connections": connections, "server": server, "rounds": len(group),
                    "rps": median(r["rps"] for r in group),
                    "p99_ms": median(r["p99_ms"] for r in group),
                    "cpu_us": median(sum(r["cpu"]) / r["responses"] * 1e6
                                     for r in group if r["responses"]),
                    "switches_per_response": median(r.get("switches", 0) / r["responses"]
                                                    for r in group if r["responses"]),
                    "turn_us": median(r["schedstat"][0] / r["schedstat"][2] / 1e3
                                      for r in group if r.get("schedstat", (0, 0, 0))[2]),
                    "wait_us_per_response": median(r["schedstat"][1] / r["responses"] / 1e3
                                                   for r in group
                                                   if r.get("schedstat") and r["responses"]),
                    "responses_per_wake": median(r["responses"] / r["wakes"] for r in group
                                                 if r.get("wakes")),
                    "busiest_requests": median(busiest_ratio(r["requests"])
                                               for r in group if r["requests"]),
                    "busiest_cpu": median(busiest_ratio(r["cpu"]) for r in group),
                    "idle_workers": max(sum(1 for c in r["cpu"] if c < 0.05) for r in group)})
    return out


def locust_requests(seconds, extra, workdir):
    """Requests per worker after a Locust run of 10 users against forkserve -w 4."""
    prefix = os.path.join(workdir, "locust" + "".join(extra))
    argv = [sys.executable, "-m", "locust", "-f", "examples/locustfile.py", "--headless",
            "-u", "10", "-r", "10", "-t", f"{seconds}s", "--csv", prefix,
            "--forkserve-app", "examples.persondb.app:app", "--forkserve-workers", str(WORKERS),
            "--forkserve-interval", "1", f"--forkserve-args={shlex.join(extra)}"]
    with procs.Group(argv, log_path=prefix + ".log", cwd=REPO) as group:
        group.popen.wait(timeout=seconds + 120)
    with open(prefix + "_memory.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    last = max(float(r["time"]) for r in rows)
    return [int(r["server_requests"]) for r in rows
            if r["role"] == "worker" and float(r["time"]) == last]


def render_locust(results):
    lines = ["Locust, 10 users, PersonDB, forkserve -w 4:", "",
             "| forkserve | requests per worker | busiest/mean |", "|---|---|---:|"]
    for label, requests in results:
        lines.append(f"| {label} | {' / '.join(f'{n:,}' for n in requests)} | "
                     f"{_f(busiest_ratio(requests), '.2f')} |")
    return "\n".join(lines) + "\n"


def _f(value, spec):
    return "-" if value is None else format(value, spec)


def render_summary(rows):
    lines = ["| connections | server | rounds | req/s | p99 ms | worker CPU µs/req | "
             "context switches/req | worker µs on a CPU per turn | runnable wait µs/req | "
             "req per loop wake | "
             "busiest/mean (requests) | busiest/mean (CPU) | most idle workers in a round |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in summarize(rows):
        lines.append(f"| {r['connections']} | {r['server']} | {r['rounds']} | "
                     f"{_f(r['rps'], ',.0f')} | {_f(r['p99_ms'], '.1f')} | "
                     f"{_f(r['cpu_us'], '.1f')} | {_f(r['switches_per_response'], '.2f')} | "
                     f"{_f(r['turn_us'], '.0f')} | {_f(r['wait_us_per_response'], '.1f')} | "
                     f"{_f(r['responses_per_wake'], '.1f')} | "
                     f"{_f(r['busiest_requests'], '.2f')} | {_f(r['busiest_cpu'], '.2f')} | "
                     f"{r['idle_workers']} |")
    return "\n".join(lines) + "\n"


def render(rows, meta):
    lines = [f"Run {meta['started']} to {meta['ended']}; {meta['conditions']}; "
             f"{os.cpu_count()} CPUs; wrk keep-alive, {meta['duration']} s a run.", "",
             "Medians over the rounds (a worker is idle with < 0.05 CPU s in a run):", "",
             render_summary(rows), "Every run:", "",
             "| round | connections | server | req/s | p99 ms | requests per worker | busiest/mean "
             "(requests) | CPU s per worker | busiest/mean (CPU) |",
             "|---:|---:|---|---:|---:|---|---:|---|---:|"]
    for r in rows:
        req = " / ".join(f"{n:,}" for n in r["requests"]) if r["requests"] else "-"
        ratio_req = busiest_ratio(r["requests"]) if r["requests"] else None
        ratio_cpu = busiest_ratio(r["cpu"])
        lines.append(
            f"| {r['round']} | {r['connections']} | {r['server']} | {r['rps']:,.0f} | {r['p99_ms']:.1f} | "
            f"{req} | {'-' if ratio_req is None else f'{ratio_req:.2f}'} | "
            f"{' / '.join(f'{c:.2f}' for c in r['cpu'])} | "
            f"{'-' if ratio_cpu is None else f'{ratio_cpu:.2f}'} |")
    return "\n".join(lines) + "\n"


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python benchmarks/balance.py",
                                description="Requests per worker under keep-alive load: "
                                            "forkserve -w 4 against Gunicorn -k gevent -w 4.")
    p.add_argument("--connections", default="4,8,16,64",
                   help="comma-separated connection counts (default: 4,8,16,64; '' for none)")
    p.add_argument("--duration", type=int, default=8, help="seconds per wrk run (default 8)")
    p.add_argument("--quick", action="store_true", help="8 and 64 connections, 3 s each")
    p.add_argument("--also", metavar="NAME=TREE [ARGS]", action="append", default=[],
                   type=parse_variant,
                   help="also run forkserve from checkout TREE with ARGS, as forkserve-NAME")
    p.add_argument("--locust", type=int, metavar="SECONDS", default=0,
                   help="also run Locust (10 users) this long, with and without balance")
    p.add_argument("--rounds", type=int, default=1, help="times to repeat all (default 1)")
    p.add_argument("--perf", action="store_true",
                   help="count the workers' epoll_wait() calls with perf stat (needs perf "
                        "and root): requests served per event-loop wake")
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--out", help="directory for results.md and the logs (default: a temp dir)")
    args = p.parse_args(argv)
    if args.quick:
        args.connections, args.duration = "8,64", 3
    args.levels = [int(c) for c in args.connections.split(",") if c.strip()]
    args.out = args.out or tempfile.mkdtemp(prefix="forkserve-balance-")
    if args.perf and not shutil.which("perf"):
        p.error("--perf needs perf on PATH (apt-get install linux-perf), or drop --perf")
    for _, _, extra in args.also:
        try:
            split_workers(extra)
        except argparse.ArgumentTypeError as ex:
            p.error(str(ex))
    return args


def main(argv=None):
    args = parse_args(argv)
    os.makedirs(os.path.join(args.out, "logs"), exist_ok=True)
    conditions = Conditions()
    result = Result.measured("balance.py", command_line("balance.py", argv), [], conditions,
                             title="connections per worker")
    meta = {"started": result.date, "duration": args.duration}
    rows, running = [], []
    with stop_on_signals():
        try:
            for spec, tree, count in servers(args.also) if args.levels else ():
                env = dict(os.environ, PYTHONPATH=os.pathsep.join([tree, APPS]),
                           PYTHONUNBUFFERED="1")
                server = start_spec(spec, python=args.python, workers=count, env=env,
                                    log_path=os.path.join(args.out, "logs", f"{spec.name}.log"),
                                    probe_path="/")
                running.append((spec.name, server))
                say(f"{spec.name}: up on port {server.port}")
            for round_no in range(1, args.rounds + 1):
                for connections in args.levels:
                    for name, server in running:
                        row = measure(name, server, connections, args.duration, args.out,
                                      perf=args.perf)
                        row["round"] = round_no
                        say(f"round {round_no}, {connections} connections, {name}: "
                            f"{row['rps']:,.0f} req/s, {row['errors']} errors, "
                            f"p99 {row['p99_ms']:.1f} ms, requests {row['requests']}, "
                            f"CPU {[round(c, 2) for c in row['cpu']]}")
                        rows.append(row)
        finally:
            for _, server in running:
                server.stop(grace=10)
        locust = [(label, locust_requests(args.locust, extra, args.out))
                  for label, extra in (("balanced", []), ("--no-balance", ["--no-balance"]))
                  if args.locust]
    meta["conditions"] = conditions.end().describe()
    meta["ended"] = datetime.datetime.now(datetime.timezone.utc).strftime("%H:%M UTC")
    result.conditions = conditions.as_dict()
    result.rows = summarize(rows) + [{"server": f"locust {label}", "requests": requests,
                                      "busiest_requests": busiest_ratio(requests)}
                                     for label, requests in locust]
    result.write(args.out)
    markdown = render(rows, meta) + ("\n" + render_locust(locust) if locust else "")
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(markdown)
    print(markdown)
    say(f"results in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
