"""What --worker-gc normal costs and saves under --share-heap, per request, A/B in one run.

    python benchmarks/share_heap_gc.py --python .venv312/bin/python [--requests 4000] [--rounds 3]

One process plays the master: it loads the Django test shop
(tests/apps/django_shop), warms it up as tests/apps/django_shop/warmup.conf.py
does (logged in to the admin), makes the heap immortal and freezes it, as
`forkserve --share-heap -c django_shop/warmup.conf.py` does. Then, ROUNDS
times, it forks one child per policy, one after the other (young, normal,
young, normal, ...: the same machine state for both); each child applies
the policy as a worker does (forkserve.memory.workergc), serves REQUESTS
requests over the client's pages in-process (forkserve.process.warmup.Client,
logged in, no sockets: the time is the application's and the collector's),
and reports its wall time per request, the time its collections took, how
many full collections ran, and its private memory (anonymous private pages,
/proc) at the end. The table gives the median over the rounds. Python 3.12+
(--no-share-heap: the master only freezes its heap, as forkserve without
the flag does; any Python).
"""

import argparse
import gc
import json
import os
import runpy
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from benchmarks.harness.machine import Conditions  # noqa: E402

APPS = os.path.join(ROOT, "tests", "apps")
MIB = 2 ** 20


class _Server:
    """The `server` the config file's hook gets: only its log is used."""

    class log:
        @staticmethod
        def info(message, *args):
            print("master:", message % args, flush=True)


def child(policy, requests, client, pages):
    from forkserve.memory import procfs, workergc
    state = workergc.apply(policy)
    full = gc.get_stats()[2]["collections"]
    started = time.perf_counter()
    for index in range(requests):
        client.get(pages[index % len(pages)])
    elapsed = time.perf_counter() - started
    return {"policy": policy, "ms_per_request": elapsed * 1000 / requests,
            "gc_ms_per_request": state.stats.pause_ns / 1e6 / requests,
            "collections": state.stats.collections,
            "full_collections": gc.get_stats()[2]["collections"] - full,
            "private_mib": procfs.read_process(os.getpid()).private / MIB}


def serve(args):
    """In the interpreter under test: the master, then its children."""
    sys.path[:0] = [ROOT, APPS]
    gc.disable()
    os.environ.setdefault("DJANGO_SHOP_DB", os.path.join(tempfile.mkdtemp(), "shop.sqlite3"))
    from django_shop.client import PAGES
    from django_shop.wsgi import application
    from forkserve.memory import cow, heap
    from forkserve.process.warmup import Client
    runpy.run_path(os.path.join(APPS, "django_shop", "warmup.conf.py"))["pre_freeze"](
        _Server, application)
    client = Client(application)  # the children's session, made before the heap is shared
    client.get("/admin/login/")
    client.post("/admin/login/", {"username": "admin", "password": "admin-password",
                                  "csrfmiddlewaretoken": client.cookies["csrftoken"]})
    if args.share_heap:
        print("master:", heap.share_heap(), flush=True)
    cow.harden()
    for _ in range(args.rounds):
        for policy in args.policies.split(","):
            reader, writer = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.close(reader)
                os.write(writer, json.dumps(child(policy, args.requests, client,
                                                  list(PAGES))).encode())
                os._exit(0)
            os.close(writer)
            with os.fdopen(reader) as pipe:
                print(pipe.read(), flush=True)
            os.waitpid(pid, 0)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--python", default=sys.executable, help="the interpreter to measure")
    p.add_argument("--requests", type=int, default=4000, help="requests per child")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--policies", default="young,normal")
    p.add_argument("--no-share-heap", dest="share_heap", action="store_false",
                   help="only freeze the master's heap, as forkserve without --share-heap")
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.serve:
        return serve(args)
    if os.sep in args.python:
        args.python = os.path.abspath(args.python)  # the child runs in tests/apps
    run = Conditions()
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} UTC, {os.cpu_count()} CPUs, load average "
          f"{run.load_before:.2f}", flush=True)
    out = subprocess.run([args.python, os.path.abspath(__file__), "--serve",
                          "--requests", str(args.requests), "--rounds", str(args.rounds),
                          "--policies", args.policies,
                          *([] if args.share_heap else ["--no-share-heap"])],
                         capture_output=True, text=True, check=True, cwd=APPS).stdout
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    print("\n".join(line for line in out.splitlines() if line.startswith("master:")))
    version = subprocess.run([args.python, "-c", "import sys; print(sys.version.split()[0])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    flag = "--share-heap" if args.share_heap else "no --share-heap (frozen only)"
    print(f"\nPython {version}, Django shop, {flag}, {args.requests:,} requests per "
          f"child, median of {args.rounds} rounds (min-max)\n")
    print("| --worker-gc | ms per request | gc ms per request | collections | full "
          "collections | private MiB at the end |")
    print("|---|---|---|---|---|---|")
    for policy in args.policies.split(","):
        mine = [r for r in rows if r["policy"] == policy]
        cells = []
        for key, digits in (("ms_per_request", 3), ("gc_ms_per_request", 3),
                            ("collections", 0), ("full_collections", 0), ("private_mib", 1)):
            values = [r[key] for r in mine]
            cells.append(f"{statistics.median(values):,.{digits}f} "
                         f"({min(values):,.{digits}f}-{max(values):,.{digits}f})")
        print(f"| {policy} | " + " | ".join(cells) + " |")
    print(f"\n{run.describe()}")


if __name__ == "__main__":
    main()
