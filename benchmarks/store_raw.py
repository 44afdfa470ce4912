"""What serving get_raw() costs, before and after a change to the store format.

    git worktree add /tmp/store-before 7a4faab     # or: git archive 7a4faab | tar -x -C DIR
    python benchmarks/store_raw.py --before /tmp/store-before

Runs the PersonDB example in store mode (`forkserve -w 1`) from both source
trees at once, both pinned to CPU 0, and loads both at the same time (one
wrk each, pinned to CPU 1), so that whatever else the machine runs weighs
on both alike; it reports per tree:

- in one process (best of 5 runs of 20,000 random lookups, best of
  `--rounds` processes; CPU time, so that other load on the machine counts
  little): get_raw() alone, and a whole request through the PersonDB Bottle
  app called as WSGI (routing, get_raw, the response), on the same store file
  the server uses;
- through the server: requests a second (wrk, `--requests` random lookups,
  5% of them for unknown people) and the server's CPU time per request
  (utime + stime of master and worker over the phase), medians of
  `--rounds` rounds after one warm-up round.

CPU per request is the figure to compare on a shared machine: other load
changes the rate more than the CPU each request costs.
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.instances import start_persondb  # noqa: E402
from benchmarks.harness.procs import group_cpu_seconds  # noqa: E402
from benchmarks.harness.wrk import LoadSpec, run_phase  # noqa: E402
from examples.persondb import generate  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent

_MICRO = """
import io, os, random, sys, time

os.environ.update(PERSONDB_MODE="store", PERSONDB_CSV=sys.argv[1], PERSONDB_STORE=sys.argv[2])
from examples.persondb.app import app, people

emails = [line.strip() for line in open(sys.argv[3])]
keys = random.Random(1).choices(emails, k=20000)
environs = [{"REQUEST_METHOD": "GET", "PATH_INFO": "/person/" + key, "SERVER_NAME": "x",
             "SERVER_PORT": "80", "SERVER_PROTOCOL": "HTTP/1.1", "wsgi.input": io.BytesIO(),
             "wsgi.url_scheme": "http", "wsgi.errors": sys.stderr} for key in keys]


def best(loop):
    runs = []
    for _ in range(5):
        started = time.process_time()
        loop()
        runs.append(time.process_time() - started)
    return min(runs) / len(keys) * 1e6


def lookups():
    get_raw = people.get_raw
    for key in keys:
        get_raw(key)


def start_response(status, headers, exc_info=None):
    if exc_info:
        raise exc_info[1]


def requests():
    for environ in environs:
        b"".join(app(dict(environ), start_response))


print(best(lookups), best(requests), people.nbytes)
"""


def micro(tree, csv_path, store_path, emails_path):
    """(get_raw() CPU us a call, WSGI app CPU us a request, store bytes) in one process."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, "-c", _MICRO, str(csv_path), str(store_path),
                          str(emails_path)],
                         env=env, cwd=str(tree), capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"the in-process measurement failed in {tree}:\n{out.stderr}")
    per_call, per_request, nbytes = out.stdout.split()
    return float(per_call), float(per_request), int(nbytes)


def side_by_side(instances, spec, requests, work, round_number):
    """Load every instance at once; return {label: (PhaseResult, server CPU seconds)}."""
    found = {}

    def drive(number, label):
        cpu = group_cpu_seconds(instances[label].pid)
        result = run_phase(instances[label].url, spec, requests, 600, str(work),
                           phase_id=10 * round_number + number)
        found[label] = result, group_cpu_seconds(instances[label].pid) - cpu

    threads = [threading.Thread(target=drive, args=item) for item in enumerate(instances)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return found


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
        instances = {}
        try:
            for label, tree in trees.items():
                instances[label] = start_persondb(
                    tree, workers=1, csv_path=csv_path, store_path=work / f"{label}.store",
                    log_path=work / f"{label}.log", cpus="0")
            for round_number in range(args.rounds + 1):  # round 0 warms up
                results = side_by_side(instances, spec, args.requests, work, round_number)
                for label, (result, cpu) in results.items():
                    if result.errors:
                        raise SystemExit(f"{label}: {result.errors} failed requests")
                    if round_number:
                        rates[label].append(result.rate)
                        cpu_us[label].append(cpu / result.responses * 1e6)
                        print(f"round {round_number} {label}: {result.rate:,.0f} req/s, "
                              f"{cpu_us[label][-1]:.0f} us CPU/request", file=sys.stderr,
                              flush=True)
        finally:
            for instance in instances.values():
                instance.stop()
        runs = {label: [] for label in trees}
        for _ in range(args.rounds):
            for label, tree in trees.items():
                runs[label].append(micro(tree, csv_path, work / f"{label}.store", emails_path))
        micros = {label: (min(run[0] for run in found), min(run[1] for run in found),
                          found[0][2]) for label, found in runs.items()}
    print(f"PersonDB, {args.rows:,} rows; both forkserve -w 1 on CPU 0, a wrk "
          f"-c{args.connections} each on CPU 1, loaded at once; {args.rounds} rounds of "
          f"{args.requests:,} lookups each, medians")
    print()
    print("| code | store file | get_raw() per call | app per request (WSGI call) "
          "| req/s through forkserve | server CPU per request |")
    print("|---|---:|---:|---:|---:|---:|")
    for label in trees:
        per_call, per_request, nbytes = micros[label]
        print(f"| {label} | {nbytes / 1e6:,.1f} MB | {per_call:.2f} us | {per_request:.1f} us "
              f"| {statistics.median(rates[label]):,.0f} "
              f"| {statistics.median(cpu_us[label]):.0f} us |")
    ratio = {name: statistics.median(values["after"]) / statistics.median(values["before"])
             for name, values in (("rate", rates), ("cpu", cpu_us))}
    after, before = micros["after"], micros["before"]
    print(f"| after / before | {after[2] / before[2]:.2f}x | {after[0] / before[0]:.2f}x "
          f"| {after[1] / before[1]:.2f}x | {ratio['rate']:.2f}x | {ratio['cpu']:.2f}x |")


if __name__ == "__main__":
    main()
