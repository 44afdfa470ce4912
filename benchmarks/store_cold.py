"""The store's first requests when its file is not in the page cache.

    python benchmarks/store_cold.py --python .venv312/bin/python
    python benchmarks/store_cold.py --tree lazy=/tmp/fs-before --tree prefetch=. --rounds 2

A store opened lazily reads its pages on first use, and a page that has left
the page cache is read from disk inside the request that touches it, while
the gevent worker waits with all its greenlets. Before each measurement this
drops the PersonDB store file from the page cache (posix_fadvise DONTNEED),
starts `forkserve -w 4` in store mode from the tree (pinned to the server
CPU), and once /health answers sends `--requests` random lookups with wrk
(lookup.lua, 32 connections, on the client CPU). Per tree and round it
prints: the share of the file in the page cache when the first answer came,
the time from start to that answer, and wrk's p50, p99, p99.9 and max.
Trees take turns within a round. Needs wrk and taskset. Writes result.json
(the harness's schema) in --out.
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.cow_cost import start  # noqa: E402
from benchmarks.harness import wrk  # noqa: E402
from benchmarks.harness.datasets import build_store, prepare_dataset  # noqa: E402
from benchmarks.harness.machine import Conditions  # noqa: E402
from benchmarks.harness.results import write_result  # noqa: E402
from benchmarks.harness.servers import REPO  # noqa: E402

#: the figures benchmarks/README.md shows of a run's rows (benchmarks.harness.index)
RESULT_COLUMNS = (
    ("tree", "tree"), ("round", "round"), ("cached_at_first_answer", "file cached at first answer",
                                           "%"),
    ("first_answer_s", "start → first answer"), ("p50_ms", "p50"), ("p99_ms", "p99"),
    ("p999_ms", "p99.9"), ("max_ms", "max"),
)


def evict(path):
    """Drop `path` from the page cache (its pages are clean: nothing writes it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def cached_share(path):
    """The share of `path` in the page cache (util-linux's fincore), or None."""
    if not shutil.which("fincore"):
        return None
    out = subprocess.run(["fincore", "--bytes", "--noheadings", "--raw", "--output", "RES",
                          path], capture_output=True, text=True).stdout.strip()
    return int(out) / os.path.getsize(path) if out.isdigit() else None


def measure(args, tree, csv_path, store_path, emails_path, log_path):
    evict(store_path)
    started = time.monotonic()
    server = start(args, "store", csv_path, log_path, tree, processes=1)  # first answer
    try:
        answered = time.monotonic() - started
        share = cached_share(store_path)
        spec = wrk.LoadSpec(emails_path=emails_path, cpus=args.client_cpus)
        result = wrk.run_phase(server.url + "/", spec, args.requests, 120,
                               os.path.dirname(log_path))
    finally:
        server.stop()
    return share, answered, result


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tree", action="append", metavar="NAME=PATH",
                   help="a forkserve source tree (default: this one); give several to compare")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--rows", type=int, default=300_000)
    p.add_argument("--requests", type=int, default=20_000, help="lookups per measurement")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--python", default=sys.executable, help="the server's interpreter")
    p.add_argument("--server-cpus", default="0")
    p.add_argument("--client-cpus", default="1")
    p.add_argument("--data-dir", default=os.path.join(tempfile.gettempdir(), "forkserve-bench"))
    p.add_argument("--out", default=os.path.join(REPO, "benchmarks", "results", "store_cold"),
                   help="where result.json goes (%(default)s)")
    args = p.parse_args(argv)
    conditions, rows = Conditions(), []
    if not (shutil.which("wrk") and shutil.which("taskset")):
        p.error("needs wrk and taskset (apt-get install wrk util-linux)")
    trees = dict(t.split("=", 1) for t in args.tree or [f"this={REPO}"])
    trees = {name: os.path.abspath(path) for name, path in trees.items()}
    csv_path, emails_path = prepare_dataset(args.rows, args.seed, args.data_dir)
    _, problem = build_store(args.python, csv_path, dict(os.environ))
    if problem:
        raise SystemExit(f"building the store failed: {problem}")
    store_path = csv_path + ".store"
    work = tempfile.mkdtemp(prefix="forkserve-store-cold-")
    print(f"{args.rows:,} people, store file {os.path.getsize(store_path) / 2**20:,.0f} MiB, "
          f"forkserve -w 4 on CPU {args.server_cpus}, {args.requests:,} random lookups after "
          "dropping the file from the page cache\n")
    print("| tree | round | file cached at first answer | start → first answer | "
          "p50 | p99 | p99.9 | max |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for round_ in range(1, args.rounds + 1):
        for name, tree in trees.items():
            share, answered, r = measure(args, tree, csv_path, store_path, emails_path,
                                         os.path.join(work, f"{name}-{round_}.log"))
            cached = "n/a (no fincore)" if share is None else f"{share:.0%}"
            print(f"| {name} | {round_} | {cached} | {answered:.2f} s | {r.p50_us / 1000:.1f} ms "
                  f"| {r.p99_us / 1000:.1f} ms | {r.p999_us / 1000:.1f} ms | "
                  f"{r.max_us / 1000:.1f} ms |", flush=True)
            rows.append({"tree": name, "round": round_, "cached_at_first_answer": share,
                         "first_answer_s": answered, "p50_ms": r.p50_us / 1000,
                         "p99_ms": r.p99_us / 1000, "p999_ms": r.p999_us / 1000,
                         "max_ms": r.max_us / 1000})
    write_result("store_cold.py", argv, rows, conditions, args.out,
                 title=f"{args.rows:,} people, {args.requests:,} lookups from a cold page cache")


if __name__ == "__main__":
    main()
