"""Requests per second of forkserve's HTTP path, two source trees side by side.

    python benchmarks/http_throughput.py --tree before=/tmp/fs-before --tree after=. \
        --rounds 3 --duration 5

For each round and each tree (alternating, so both see the same machine load)
it starts `python -m forkserve -w 0` from that tree, pinned to CPU 0, runs
wrk pinned to CPU 1 against two apps:

  hello     a WSGI hello world (one 13-byte body, Content-Length set)
  persondb  examples.persondb (dict mode, 2,000 rows), GET /person/<email>

and prints req/s and the server's CPU time per request (user + system, from
/proc/PID/stat, which shared-machine load disturbs far less than req/s) per
tree, the after/before ratios of the medians, and the CPU steal seen during
the run (from /proc/stat): a steal above a few percent means the ratios are
not worth trusting. The machine may be shared: run it twice and compare.
"""

import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LISTENING = re.compile(r"Listening at: http://127\.0\.0\.1:(\d+)")

HELLO = textwrap.dedent('''
    def app(environ, start_response):
        start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", "13")])
        return [b"Hello, world!"]
''')

LUA = textwrap.dedent('''
    local emails = {}
    for line in io.lines(os.getenv("BENCH_EMAILS")) do emails[#emails + 1] = line end
    local i = 0
    request = function()
        i = i % #emails + 1
        return wrk.format("GET", "/person/" .. emails[i])
    end
''')


def cpu_times():
    with open("/proc/stat") as handle:
        fields = [int(x) for x in handle.readline().split()[1:]]
    return sum(fields), fields[7]  # total, steal


def start_logged(command, cwd, env, log_path):
    """Start `command` in its own process group, logging to `log_path`; wait
    for its "Listening at" line and return (process, port)."""
    log = open(log_path, "w+b")
    proc = subprocess.Popen(command, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    log.close()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        match = LISTENING.search(Path(log_path).read_text(errors="replace"))
        if match:
            return proc, int(match.group(1))
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    raise SystemExit(f"{command} did not start:\n{Path(log_path).read_text()}")


def start(tree, app, env, log_path):
    environment = dict(os.environ, PYTHONPATH=f"{tree}:{env.pop('EXTRA_PATH')}",
                       PYTHONUNBUFFERED="1", **env)
    return start_logged(["taskset", "-c", "0", sys.executable, "-m", "forkserve", "-w", "0",
                         "-b", "127.0.0.1:0", app], tree, environment, log_path)


def stop(proc):
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def cpu_seconds(pid):
    """User + system CPU seconds the process has used (/proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wrk(port, path, duration, connections, script=None, env=None):
    command = ["taskset", "-c", "1", "wrk", "-t1", f"-c{connections}", f"-d{duration}s"]
    if script:
        command += ["-s", script]
    out = subprocess.run(command + [f"http://127.0.0.1:{port}{path}"], capture_output=True,
                         text=True, env=dict(os.environ, **(env or {})), check=True).stdout
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)|Socket errors: (.*)", out)
    if errors:
        raise SystemExit(f"wrk saw errors:\n{out}")
    return (float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),
            int(re.search(r"(\d+) requests in", out).group(1)))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tree", action="append", required=True, metavar="NAME=PATH",
                        help="a forkserve source tree to measure (give two: before and after)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=int, default=5, help="seconds of wrk per measurement")
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--apps", default="hello,persondb", help="comma-separated: hello,persondb")
    args = parser.parse_args()
    trees = dict(t.split("=", 1) for t in args.tree)
    work = Path(tempfile.mkdtemp(prefix="http-throughput-"))
    (work / "hello_app.py").write_text(HELLO)
    (work / "lookup.lua").write_text(LUA)
    rows = work / "rows.csv"
    emails = work / "emails.txt"
    apps = {"hello": ("hello_app:app", "/", {}),
            "persondb": ("examples.persondb.app:app", "/health", {"PERSONDB_MODE": "dict",
                                                           "PERSONDB_CSV": str(rows)})}
    for extra, path in (([], rows), (["--emails"], emails)):
        subprocess.run([sys.executable, "-m", "examples.persondb.generate", "--rows", "2000",
                        "-o", str(path), *extra], cwd=ROOT, check=True)
    apps = {name: apps[name] for name in args.apps.split(",")}
    results = {(name, app): [] for name in trees for app in apps}
    total0, steal0 = cpu_times()
    for round_ in range(args.rounds):
        for app, (spec, path, env) in apps.items():
            for name, tree in trees.items():
                proc, port = start(Path(tree).resolve(), spec,
                                   dict(env, EXTRA_PATH=f"{work}:{ROOT}"), work / f"{name}.log")
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{port}{path}").read()
                    cpu = cpu_seconds(proc.pid)
                    if app == "persondb":
                        rate, count = wrk(port, "/", args.duration, args.connections,
                                          str(work / "lookup.lua"), {"BENCH_EMAILS": str(emails)})
                    else:
                        rate, count = wrk(port, path, args.duration, args.connections)
                    micros = (cpu_seconds(proc.pid) - cpu) * 1e6 / count
                finally:
                    stop(proc)
                results[name, app].append((rate, micros))
                print(f"round {round_ + 1} {app:9} {name:8} {rate:10.0f} req/s "
                      f"{micros:7.1f} CPU us/request", flush=True)
    total1, steal1 = cpu_times()
    names = list(trees)
    print(f"\nCPU steal during the run: {100 * (steal1 - steal0) / max(1, total1 - total0):.1f}%")
    for app in apps:
        for i, unit in ((0, "req/s"), (1, "CPU us/request")):
            medians = {name: statistics.median(r[i] for r in results[name, app]) for name in names}
            line = "  ".join(f"{name} {medians[name]:.1f}" for name in names)
            ratio = medians[names[-1]] / medians[names[0]]
            print(f"{app:9} median {unit}: {line}  ratio {names[-1]}/{names[0]} {ratio:.3f}")


if __name__ == "__main__":
    main()
