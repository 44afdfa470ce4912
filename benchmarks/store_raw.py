"""What serving get_raw() costs, before and after a change to the store format.

    git worktree add /tmp/store-before 7a4faab     # or: git archive 7a4faab | tar -x -C DIR
    python benchmarks/store_raw.py --before /tmp/store-before

Runs the PersonDB example in store mode (`forkserve -w 1`, pinned to CPU 0,
wrk pinned to CPU 1) from each source tree in turn, alternating the order
every round, and reports per tree:

- get_raw() alone: CPU microseconds a call, best of 5 runs of 20,000 random
  lookups in one process (best of `--rounds` processes), on the same store
  file the server uses;
- through the server: requests a second (wrk, `--requests` random lookups,
  5% of them for unknown people) and the server's CPU time per request
  (utime + stime of master and worker over the phase), medians of
  `--rounds` rounds.

CPU per request is the figure to compare on a shared machine: other load
changes the rate more than the CPU each request costs.
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.instances import start_persondb  # noqa: E402
from benchmarks.load import LoadSpec, run_phase  # noqa: E402
from benchmarks.procs import cpu_seconds  # noqa: E402
from examples.persondb import generate  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent

_MICRO = """
import random, sys, time
from forkserve.store import Store

store = Store.open(sys.argv[1])
emails = [line.strip() for line in open(sys.argv[2])]
keys = random.Random(1).choices(emails, k=20000)
get_raw = store.get_raw
runs = []
for _ in range(5):
    started = time.process_time()
    for key in keys:
        get_raw(key)
    runs.append(time.process_time() - started)
print(min(runs) / len(keys) * 1e6, store.nbytes)
"""


def micro(tree, store_path, emails_path):
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, "-c", _MICRO, str(store_path), str(emails_path)],
                         env=env, cwd=str(tree), capture_output=True, text=True, check=True)
    per_call, nbytes = out.stdout.split()
    return float(per_call), int(nbytes)


def group_cpu(instance):
    return sum(cpu_seconds(pid) or 0.0 for pid in instance.group.members())


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", required=True, help="source tree of the code to compare to")
    parser.add_argument("--after", default=str(ROOT), help="source tree (default: this one)")
    parser.add_argument("--rows", type=int, default=100_000, help="PersonDB rows (default 100,000)")
    parser.add_argument("--requests", type=int, default=40_000, help="lookups per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--connections", type=int, default=16)
    args = parser.parse_args(argv)
    trees = {"before": Path(args.before).resolve(), "after": Path(args.after).resolve()}

    with tempfile.TemporaryDirectory(prefix="forkserve-store-raw-") as work:
        work = Path(work)
        csv_path, emails_path = work / "people.csv", work / "emails.txt"
        generate.generate_file(str(csv_path), args.rows)
        generate.generate_file(str(emails_path), args.rows, only_emails=True)
        spec = LoadSpec(emails_path=str(emails_path), connections=args.connections, cpus="1")
        rates = {label: [] for label in trees}
        cpu_us = {label: [] for label in trees}
        for round_number in range(args.rounds):
            order = list(trees) if round_number % 2 == 0 else list(trees)[::-1]
            for label in order:
                instance = start_persondb(
                    trees[label], workers=1, csv_path=csv_path, store_path=work / f"{label}.store",
                    log_path=work / f"{label}.log", cpus="0")
                try:
                    run_phase(instance.url, spec, 2_000, 60, str(work), phase_id=100)  # warm-up
                    cpu_before = group_cpu(instance)
                    result = run_phase(instance.url, spec, args.requests, 300, str(work),
                                       phase_id=round_number)
                    cpu = group_cpu(instance) - cpu_before
                finally:
                    instance.stop()
                if result.errors:
                    raise SystemExit(f"{label}: {result.errors} failed requests")
                rates[label].append(result.rate)
                cpu_us[label].append(cpu / result.responses * 1e6)
                print(f"round {round_number + 1} {label}: {result.rate:,.0f} req/s, "
                      f"{cpu_us[label][-1]:.0f} us CPU/request", file=sys.stderr, flush=True)
        micros = {label: min(micro(tree, work / f"{label}.store", emails_path)
                             for _ in range(args.rounds))
                  for label, tree in trees.items()}
    print(f"PersonDB, {args.rows:,} rows; forkserve -w 1 on CPU 0, wrk -c{args.connections} "
          f"on CPU 1; {args.rounds} rounds of {args.requests:,} lookups, medians")
    print()
    print("| code | store file | get_raw() per call | req/s | server CPU per request |")
    print("|---|---:|---:|---:|---:|")
    for label in trees:
        per_call, nbytes = micros[label]
        print(f"| {label} | {nbytes / 1e6:,.1f} MB | {per_call:.2f} us "
              f"| {statistics.median(rates[label]):,.0f} "
              f"| {statistics.median(cpu_us[label]):.0f} us |")
    ratio = {name: statistics.median(values["after"]) / statistics.median(values["before"])
             for name, values in (("rate", rates), ("cpu", cpu_us))}
    print(f"| after / before | {micros['after'][1] / micros['before'][1]:.2f}x "
          f"| {micros['after'][0] / micros['before'][0]:.2f}x | {ratio['rate']:.2f}x "
          f"| {ratio['cpu']:.2f}x |")


if __name__ == "__main__":
    main()
