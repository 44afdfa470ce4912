"""Two forkserve trees' cost per request, measured at the same instants.

    python benchmarks/together.py --before DIR [--app benchmarks.hello_app:app]
                                  [--workers 0] [--rounds 10] [--seconds 3]

Starts `python -m forkserve` from this tree and from DIR (another checkout,
e.g. `git worktree add /tmp/old 7a4faab`), each with PYTHONPATH set to its
tree, both pinned to CPU 0, serving the same app (imported from this tree's
directory, so both serve the same code). Each round, two wrk processes on
CPU 1 (64 keep-alive connections each) load both servers at once for
--seconds: the kernel splits CPU 0 evenly between two busy servers, so the
ratio of their requests/s is the inverse ratio of their CPU cost per
request, taken under the same conditions at every instant (see "What the
access log costs" in benchmarks/README.md for why: on a shared VM two runs
made a minute apart differ by a third). Prints each round and the median
ratio, with CPU steal before and after.

Both servers alternating on one CPU evict each other's caches, which adds
to the cost of both; the ratio is the figure, not the absolute req/s.
"""

import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if __package__ in (None, ""):
    sys.path.insert(0, ROOT)

from benchmarks.accesslog import answers, steal_jiffies  # noqa: E402

LISTENING = re.compile(rb"Listening at: http://127\.0\.0\.1:(\d+)")


def start(tree, args, log_path):
    log = open(log_path, "w+b")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([tree, ROOT]))
    proc = subprocess.Popen(
        ["taskset", "-c", "0", sys.executable, "-m", "forkserve", "-b", "127.0.0.1:0",
         "-w", str(args.workers), args.app],
        cwd=tree, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        log.seek(0)
        match = LISTENING.search(log.read())
        if match and answers(int(match.group(1))):
            return proc, int(match.group(1))
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    raise SystemExit(f"forkserve from {tree} did not start; see {log_path}")


def steal_seconds():
    return steal_jiffies() / os.sysconf("SC_CLK_TCK")


def round_together(ports, seconds):
    """{name: requests/s} with every server loaded at once."""
    runs = {name: subprocess.Popen(
        ["taskset", "-c", "1", "wrk", "-t1", "-c64", f"-d{seconds}s",
         f"http://127.0.0.1:{port}/"], stdout=subprocess.PIPE, text=True)
        for name, port in ports.items()}
    rates = {}
    for name, run in runs.items():
        out = run.communicate()[0]
        rates[name] = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    return rates


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="the other tree's directory")
    parser.add_argument("--app", default="benchmarks.hello_app:app")
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--seconds", type=int, default=3)
    parser.add_argument("--logs", default="/tmp", help="directory for the servers' logs")
    args = parser.parse_args()
    trees = {"before": os.path.abspath(args.before), "after": ROOT}
    servers = {name: start(tree, args, os.path.join(args.logs, f"together-{name}.log"))
               for name, tree in trees.items()}
    ratios = []
    steal, started = steal_seconds(), time.monotonic()
    try:
        for number in range(args.rounds):
            rates = round_together({name: port for name, (_, port) in servers.items()},
                                   args.seconds)
            ratios.append(rates["after"] / rates["before"])
            print(f"round {number + 1}: before {rates['before']:.0f} req/s, after "
                  f"{rates['after']:.0f} req/s: {ratios[-1]:.3f}x", flush=True)
    finally:
        for proc, _ in servers.values():
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(30)
    print(f"median of {args.rounds} rounds: after/before {statistics.median(ratios):.3f}x "
          f"requests/s (rounds {min(ratios):.3f}-{max(ratios):.3f}), so the cost per request "
          f"after is {1 / statistics.median(ratios):.3f}x before; -w {args.workers}, {args.app}; "
          f"CPU steal {steal_seconds() - steal:.1f} s over {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
