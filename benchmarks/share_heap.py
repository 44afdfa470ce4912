"""Heap sharing measured side by side: Gunicorn --preload, forkserve (sharing on by
default), forkserve --no-share-heap.

    python benchmarks/share_heap.py                        # PersonDB, 300,000 people
    python benchmarks/share_heap.py --apps flask,django    # the real apps
    python benchmarks/share_heap.py --quick                # 20,000 people, 20,000 lookups
    python3.12 -m venv .venv312 && .venv312/bin/pip install -e '.[bench]'
    python benchmarks/share_heap.py --python .venv312/bin/python   # the servers on 3.12

Heap sharing needs Python 3.12+ (immortal objects); on an older Python the
"forkserve" row measures what --no-share-heap does, and the run says so.
--python runs the servers on another interpreter, one with forkserve and
the benchmark extras installed (as the two lines above make one).

For one Python, each app is served in turn, 4 workers, by:

- gunicorn: Gunicorn --preload -k gevent (on a socket this harness bound),
  monkey-patched before the app loads (benchmarks/apps/gunicorn_patched.conf.py);
- forkserve: forkserve, no flag (the heap is shared where the Python allows);
- no-share-heap: forkserve --no-share-heap;
- forkserve + warmup: the default with the app's warm-up (Flask, Django);
- one process: forkserve -w 0 (PersonDB only: the "x one process" base).

Each server gets the same requests after it is ready: random PersonDB
lookups with wrk (benchmarks/harness/wrk.py), or for the Flask and Django test apps
(tests/apps/) a fixed mix of their pages from 8 keep-alive Python clients
(Django's admin pages with a logged-in session). Then every process of the
server is read from /proc: total PSS, and each worker's private memory
(anonymous private pages: what it copied plus what it allocated). For
forkserve, the master's log gives the application's load time and, with the
default, how long making the heap immortal took. With --why, `forkserve memory
--why --json` runs on the sharing server's busiest worker and the
benchmark prints what is still copied, by type.
"""

import argparse
import http.client
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.harness import wrk as load  # noqa: E402
from benchmarks.harness.datasets import prepare_dataset  # noqa: E402
from benchmarks.harness.machine import Conditions, add_common_options, parse_quick  # noqa: E402
from benchmarks.harness.procs import sample_group  # noqa: E402
from benchmarks.harness.servers import HERE, REPO, bind_listener  # noqa: E402
from benchmarks.harness.start import start  # noqa: E402

APPS_DIR = os.path.join(REPO, "tests", "apps")
sys.path.insert(0, APPS_DIR)  # the Flask and Django test apps' client modules

MIB = 2 ** 20
WORKERS = 4
_LOADED = re.compile(rb"loaded \S+ in ([\d.]+) s")
_SHARED = re.compile(rb"Heap sharing: shared ([\d,]+) objects \(([\d,.]+) MB\) in ([\d.]+) s")
_WARMED = re.compile(rb"(?:--warmup|pre_freeze): .*? in ([\d.]+) s")


# -- the apps -----------------------------------------------------------------------


def persondb(args):
    csv_path, emails_path = prepare_dataset(args.rows, args.seed, args.data_dir)
    spec = load.LoadSpec(emails_path=emails_path, cpus=None)

    def drive(port):
        result = load.run_phase(f"http://127.0.0.1:{port}/", spec, args.requests, 1800,
                                args.out)
        return result.responses, result.errors
    return dict(app="examples.persondb.app:app", cwd=REPO, health="/health",
                env={"PERSONDB_CSV": csv_path, "PERSONDB_MODE": "dict"}, drive=drive,
                one_process=True)


def flask(args):
    from flask_shop.client import PAGES

    def drive(port):
        return fetch_pages(port, PAGES, args.app_requests or args.requests, {})
    return dict(app="flask_shop:app", cwd=APPS_DIR, health="/", env={}, drive=drive,
                one_process=False, warmup=sorted(set(PAGES)))


def django(args):
    from django_shop.client import PAGES, login

    def drive(port):
        return fetch_pages(port, PAGES, args.app_requests or args.requests, login(port))
    db = os.path.join(args.out, "django.sqlite3")
    # The warm-up logs in to the admin first: a pre_freeze hook in a config file.
    return dict(app="django_shop.wsgi:application", cwd=APPS_DIR, health="/en/",
                env={"DJANGO_SHOP_DB": db}, drive=drive, one_process=False,
                warmup_config=os.path.join(APPS_DIR, "django_shop", "warmup.conf.py"))


APPS = {"persondb": persondb, "flask": flask, "django": django}


def fetch_pages(port, pages, requests, headers, clients=8):
    """GET `pages` round robin, `requests` in all, over `clients` keep-alive
    connections: (answered with 200, other answers)."""
    counts = {"ok": 0, "other": 0}
    lock = threading.Lock()

    def client(number):
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        ok = other = 0
        try:
            for index in range(number, requests, clients):
                status = _get(connection, pages[index % len(pages)], headers)
                if status == 200:
                    ok += 1
                else:
                    other += 1
        finally:
            connection.close()
            with lock:
                counts["ok"] += ok
                counts["other"] += other
    threads = [threading.Thread(target=client, args=(n,)) for n in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return counts["ok"], counts["other"]


def _get(connection, path, headers):
    """GET path on a keep-alive connection: the status. A server may close an
    idle keep-alive connection (Gunicorn after --keep-alive, 2 s): then the
    request is sent again once, on a new connection, as browsers do."""
    for attempt in (1, 2):
        try:
            connection.request("GET", path, headers=headers)
            response = connection.getresponse()
            response.read()
        except (ConnectionResetError, BrokenPipeError, http.client.RemoteDisconnected):
            connection.close()  # the next request() connects again
            if attempt == 2:
                raise
            continue
        if response.getheader("Connection", "").lower() == "close":
            connection.close()
        return response.status


# -- the servers --------------------------------------------------------------------


def commands(python, setup, extra=()):
    fs = [python, "-m", "forkserve", "-b", "127.0.0.1:0", "--stats", "127.0.0.1:0", *extra]
    app = setup["app"]
    yield "gunicorn", None
    yield "forkserve", fs + ["-w", str(WORKERS), app]
    yield "no-share-heap", fs + ["-w", str(WORKERS), "--no-share-heap", app]
    if setup.get("warmup") or setup.get("warmup_config"):
        warmup = [arg for path in setup.get("warmup", ()) for arg in ("--warmup", path)]
        if setup.get("warmup_config"):
            warmup += ["-c", setup["warmup_config"]]
        yield "forkserve + warmup", fs + ["-w", str(WORKERS), *warmup, app]
    if setup["one_process"]:
        yield "one process", fs + ["-w", "0", app]


def gunicorn_argv(python, fd, app):
    return [python, "-m", "gunicorn", "--preload", "-k", "gevent", "-w", str(WORKERS),
            "-b", f"fd://{fd}", "-c", os.path.join(HERE, "apps", "gunicorn_patched.conf.py"),
            "--timeout", "300",
            "--worker-connections", "1000", app]


def measure(name, argv, python, setup, args):
    app_name = setup["app"].split(":")[0].split(".")[0]
    log_path = os.path.join(args.out, f"{app_name}-{name.replace(' ', '-')}.log")
    listener = None
    if argv is None:
        listener = bind_listener()
        argv = gunicorn_argv(python, listener.fileno(), setup["app"])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([setup["cwd"], REPO]), **setup["env"])
    started = time.monotonic()
    with start(argv, log_path=log_path, env=env, cwd=setup["cwd"], listener=listener,
               processes=1 if name == "one process" else 1 + WORKERS,
               probe_path=setup["health"], timeout=600) as server:
        ready_s = time.monotonic() - started
        answered, failed = setup["drive"](server.port)
        samples = sample_group(server.pid, name == "one process")
        collections, pause = worker_gc(server)
        text = server.log()
        workers = [s for s in samples if s.role == "worker"]
        figures = dict(server=name, ready_s=ready_s, answered=answered, failed=failed,
                       total_pss=sum(s.pss for s in samples),
                       private=[s.private for s in workers] or [samples[0].private],
                       loaded_s=_number(_LOADED, text, 1), shared_s=_number(_SHARED, text, 3),
                       shared_objects=_number(_SHARED, text, 1),
                       shared_mb=_number(_SHARED, text, 2),
                       warmup_s=_number(_WARMED, text, 1),
                       gc_collections=collections, gc_pause_s=pause)
        if args.why and name.startswith("forkserve") and workers:
            busiest = max(workers, key=lambda s: s.private)
            figures["why"] = why(python, busiest.pid)
    return figures


def worker_gc(server):
    """The workers' garbage collections and seconds spent in them, from
    forkserve's stats endpoint: (None, None) for a server without one."""
    port = server.stats_port()
    if port is None:
        return None, None
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request("GET", "/json")
        rows = [row for row in json.loads(connection.getresponse().read())["processes"]
                if row["role"] == "worker"]
    finally:
        connection.close()
    return (sum(row["gc_collections"] or 0 for row in rows),
            sum(row["gc_pause"] or 0 for row in rows))


def _number(pattern, text, group):
    match = pattern.search(text)
    return float(match.group(group).replace(b",", b"")) if match else None


def why(python, pid):
    out = subprocess.run([python, "-m", "forkserve", "memory", "--why", str(pid), "--json"],
                         capture_output=True, text=True, timeout=900, cwd=REPO)
    if out.returncode != 0:
        return {"error": out.stderr.strip()[-400:]}
    return json.loads(out.stdout)


# -- the report ----------------------------------------------------------------------


def report(app, python_version, rows, base):
    lines = [f"\n### {app}, Python {python_version}, {WORKERS} workers\n",
             "| server | answered | total PSS MiB | x one process | worker private MiB (max) "
             "| load s | sharing s | warmup s | worker gc: collections, ms per 1,000 requests |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ratio = f"{r['total_pss'] / base:.2f}" if base else "-"
        loaded = f"{r['loaded_s']:.1f}" if r["loaded_s"] is not None else "-"
        shared = f"{r['shared_s']:.2f}" if r["shared_s"] is not None else "-"
        warmed = f"{r['warmup_s']:.2f}" if r["warmup_s"] is not None else "-"
        collected = "-"
        if r.get("gc_collections") is not None and r["answered"]:
            collected = (f"{r['gc_collections']:,}, "
                         f"{r['gc_pause_s'] * 1e6 / r['answered']:.1f}")
        lines.append(f"| {r['server']} | {r['answered']:,} (+{r['failed']} other) | "
                     f"{r['total_pss'] / MIB:,.1f} | {ratio} | {max(r['private']) / MIB:,.1f} | "
                     f"{loaded} | {shared} | {warmed} | {collected} |")
    return "\n".join(lines)


def why_summary(answer):
    if "error" in answer:
        return f"why failed: {answer['error']}"
    lines = [f"copied on objects: {answer.get('on_objects_bytes', 0) / MIB:.1f} MiB"]
    for entry in answer.get("types", [])[:10]:
        lines.append(f"  {entry}")
    for entry in answer.get("owners", [])[:10]:
        lines.append(f"  owner {entry}")
    return "\n".join(lines)


QUICK = {"rows": 20_000, "requests": 20_000, "app_requests": 2000}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--apps", default="persondb", help="comma-separated: persondb,flask,django")
    p.add_argument("--rows", type=int, default=300_000)
    p.add_argument("--requests", type=int, default=600_000, help="PersonDB lookups (600,000)")
    p.add_argument("--app-requests", type=int, default=20_000,
                   help="requests to the Flask and Django apps (20,000)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--why", action="store_true", help="run forkserve memory --why after")
    p.add_argument("--servers", default="", help="only these, comma-separated (default: all)")
    p.add_argument("--forkserve-args", default="", help="more flags for every forkserve")
    p.add_argument("--data-dir", default=os.path.join(tempfile.gettempdir(), "forkserve-bench"))
    p.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "forkserve-share-heap"))
    add_common_options(p, QUICK)
    args = parse_quick(p, argv, QUICK)
    if os.sep in args.python:
        args.python = os.path.abspath(args.python)  # the apps' servers run from tests/apps
    if "persondb" in args.apps and not shutil.which("wrk"):
        p.error("PersonDB's load needs wrk (apt-get install wrk)")
    os.makedirs(args.out, exist_ok=True)
    version = subprocess.run([args.python, "-c", "import sys; print(sys.version.split()[0])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    run = Conditions()
    print(f"Python {version}, {os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d %H:%M:%S')}, "
          f"load average {run.load_before:.2f}", flush=True)
    if tuple(int(part) for part in version.split(".")[:2]) < (3, 12):
        print(f"Python {version} cannot share the heap (it needs 3.12+): the forkserve row "
              "measures what --no-share-heap does. To measure sharing, pass --python a "
              "Python 3.12+ interpreter with forkserve installed.", flush=True)
    results = {}
    for app in args.apps.split(","):
        setup = APPS[app](args)
        rows = []
        for name, argv in commands(args.python, setup, shlex.split(args.forkserve_args)):
            if args.servers and name not in args.servers.split(","):
                continue
            started, server_run = time.monotonic(), Conditions()
            rows.append(measure(name, argv, args.python, setup, args))
            print(f"  {app} / {name}: {time.monotonic() - started:.0f} s, "
                  f"{server_run.describe()}", flush=True)
        base = next((r["total_pss"] for r in rows if r["server"] == "one process"), None)
        print(report(app, version, rows, base), flush=True)
        for r in rows:
            if "why" in r:
                print(why_summary(r["why"]), flush=True)
        results[app] = rows
    print(f"whole run, {time.strftime('%H:%M:%S')}: {run.describe()}", flush=True)
    with open(os.path.join(args.out, f"share_heap-{version}.json"), "w") as handle:
        json.dump(results, handle, indent=1)


if __name__ == "__main__":
    main()
