"""What --worker-gc costs and saves: memory growth and copied pages per policy.

For each app in benchmarks/apps/gcapps.py (probe, flask, django, and django-404:
the same Django app asked for a URL it does not have) and each policy,
starts ``forkserve -w 2 --worker-gc POLICY``, sends REQUESTS requests over
keep-alive connections, and reads from the stats endpoint:

- growth: the workers' private (anonymous) memory after minus before, MiB,
  summed over both workers. With collection off, cyclic garbage piles up
  here; a policy that copied the master's frozen dataset would show it here
  too (requests never read the dataset).
- collections, pause: the workers' garbage collections and the time spent
  in them, from the scoreboard (forkserve.memory.workergc).

    python benchmarks/worker_gc.py --requests 20000 --apps probe,flask,django
    python benchmarks/worker_gc.py --quick      # the probe app, 2,000 requests

Writes result.json (the harness's schema) in --out. req/s is given, but on
a shared machine it is the neighbours' figure as much as the policy's.
"""

import argparse
import http.client
import json
import os
import sys
import threading
import time

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.harness.machine import Conditions, add_common_options, parse_quick  # noqa: E402
from benchmarks.harness.results import write_result  # noqa: E402
from benchmarks.harness.start import start  # noqa: E402
from forkserve.memory.workergc import POLICIES  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MIB = 1024 * 1024

#: the figures benchmarks/README.md shows of a run's rows (benchmarks.harness.index)
RESULT_COLUMNS = (
    ("app", "app"), ("policy", "policy"), ("growth_mib", "private growth, 2 workers (MiB)"),
    ("private_mib", "private after (MiB)"), ("collections", "collections"),
    ("pause_ms", "pause total"), ("req_s", "req/s", ""),
)


def _stats(port):
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    connection.request("GET", "/json")
    report = json.loads(connection.getresponse().read())
    connection.close()
    return [row for row in report["processes"] if row["role"] == "worker"]


#: app -> (GCAPP, path requested, status expected)
APPS = {"probe": ("probe", "/", 200), "flask": ("flask", "/", 200),
        "django": ("django", "/", 200), "django-404": ("django", "/missing", 404)}


def _drive(port, requests, path="/", status=200, connections=4):
    def client(count):
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        for _ in range(count):
            connection.request("GET", path)
            response = connection.getresponse()
            response.read()
            assert response.status == status, response.status
        connection.close()

    threads = [threading.Thread(target=client, args=(requests // connections,))
               for _ in range(connections)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.monotonic() - started


QUICK = {"requests": 2000, "apps": "probe"}


def measure(app, policy, requests, log_dir, python=sys.executable):
    log_path = os.path.join(log_dir, f"{app}-{policy}.log")
    kind, path, status = APPS[app]
    env = dict(os.environ, GCAPP=kind)
    with start([python, "-m", "forkserve", "-b", "127.0.0.1:0", "-w", "2",
                "--stats", "127.0.0.1:0", "--worker-gc", policy, "benchmarks.apps.gcapps:app"],
               log_path=log_path, env=env, processes=3, probe_path="/", timeout=120) as server:
        port, stats = server.port, server.stats_port()
        _drive(port, 400, path, status)  # warm up: imports and caches of the first requests
        before = {row["pid"]: row for row in _stats(stats)}
        seconds = _drive(port, requests, path, status)
        after = _stats(stats)
        growth = sum(row["private"] - before[row["pid"]]["private"] for row in after
                     if row["pid"] in before)
        return {
            "app": app, "policy": policy, "requests": requests,
            "growth_mib": growth / MIB,
            "private_mib": sum(row["private"] for row in after) / MIB,
            "collections": sum(row["gc_collections"] or 0 for row in after),
            "pause_ms": sum(row["gc_pause"] or 0 for row in after) * 1000,
            "req_s": requests / seconds,
        }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--apps", default=",".join(APPS))
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--log-dir", default="/tmp")
    parser.add_argument("--out", default=os.path.join(REPO, "benchmarks", "results", "worker_gc"),
                        help="where result.json goes (%(default)s)")
    add_common_options(parser, QUICK)
    args = parse_quick(parser, argv, QUICK)
    conditions, rows = Conditions(), []
    print("| app | policy | private growth, 2 workers | private after | collections | "
          "pause total | pause per collection | req/s |")
    print("|---|---|---|---|---|---|---|---|")
    for app in args.apps.split(","):
        for policy in args.policies.split(","):
            r = measure(app, policy, args.requests, args.log_dir, args.python)
            rows.append(r)
            per = r["pause_ms"] / r["collections"] if r["collections"] else 0
            print(f"| {app} | {policy} | {r['growth_mib']:+.1f} MiB | {r['private_mib']:.1f} MiB "
                  f"| {r['collections']:,} | {r['pause_ms']:.1f} ms | {per * 1000:.0f} µs "
                  f"| {r['req_s']:,.0f} |", flush=True)
    print(conditions.describe())
    write_result("worker_gc.py", argv, rows, conditions, args.out,
                 title=f"--worker-gc policies, {args.requests:,} requests")


if __name__ == "__main__":
    main()
