"""What copy-on-write costs a plain-dict worker in CPU, measured with perf.

    python benchmarks/cow_cost.py --python .venv312/bin/python   # dict and share, 300,000 people
    python benchmarks/cow_cost.py --modes dict --rows 20000 --requests 10000   # a quick look

For each PersonDB data mode it starts `forkserve -w 4` (pinned to the server
CPU) on the same cached dataset as run.py, then sends `--requests` random
lookups with wrk (on the client CPU, lookup.lua, 32 connections, as run.py's
phases) while `perf record -a -g` samples the server CPU. It prints, per mode:

- **req/s** and **CPU/req**: user + system CPU of the server's processes
  (/proc/PID/stat) over the responses, perf running (perf's own sampling
  costs a few percent);
- **faults/req**: the workers' minor page faults over the responses (each
  copy-on-write copy of a page is one; a fault also maps a page read for
  the first time, so a few remain without copies);
- **in page faults**: the share of the workers' perf samples with the
  kernel's page-fault entry (asm_exc_page_fault) on the stack, and the part
  of it in do_wp_page (the copy on write itself) and in the copy of the
  page's 4 KiB; with **CPU/req** this gives the µs per request the copies cost.

The workers start fresh, so the lookups run while their copies are being
made, as in run.py's phases (the first 20,000 lookups per worker are where
the copying happens). `share` needs Python 3.12+. Needs wrk, taskset and perf.
Writes result.json (the harness's schema) in --result.
"""

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.harness import wrk  # noqa: E402
from benchmarks.harness.datasets import prepare_dataset  # noqa: E402
from benchmarks.harness.machine import Conditions  # noqa: E402
from benchmarks.harness.procs import Group, sample_group  # noqa: E402
from benchmarks.harness.results import table, write_result  # noqa: E402
from benchmarks.harness.servers import APP, REPO  # noqa: E402
from benchmarks.harness.start import start as start_server  # noqa: E402

#: the figures benchmarks/README.md shows of a run's rows (benchmarks.harness.index)
RESULT_COLUMNS = (
    ("mode", "mode"), ("rps", "req/s"), ("cpu_us", "CPU/req", "µs"), ("faults", "faults/req"),
    ("fault", "in page faults", "%"), ("cow", "copy on write", "%"), ("copy", "page copy", "%"),
    ("us_in_faults", "µs/req in page faults"), ("samples", "worker samples"),
)

WORKER_COMM = "forkserve: work"  # the workers' title, as the kernel's 15-byte comm keeps it
FAULT, COW = "asm_exc_page_fault", "do_wp_page"
PAGE_COPIES = ("copy_mc_enhanced_fast_string", "copy_page", "copy_mc_fragile")


def start(args, mode, csv_path, log_path, tree=REPO, processes=5):
    """`forkserve -w 4` from `tree` on PersonDB in `mode`, once /health
    answers and `processes` of its processes exist (5: the master and every
    worker): a harness Server."""
    env = dict(os.environ, PERSONDB_CSV=csv_path, PERSONDB_MODE=mode, PYTHONPATH=tree)
    return start_server([args.python, "-m", "forkserve", "-w", "4", "-b", "127.0.0.1:0", APP],
                        log_path=log_path, env=env, cwd=tree, cpus=args.server_cpus,
                        processes=processes, timeout=300)


def comm_samples(lines, comm):
    """Samples of `comm` in `perf report --sort comm -n --stdio` output."""
    for line in lines:
        parts = line.split(None, 3)
        if len(parts) == 4 and parts[0].endswith("%") and parts[3].strip() == comm:
            return int(parts[2])
    return 0


def symbol_shares(lines):
    """{symbol: share of the samples with it on the stack} from `perf report
    --children --sort sym --stdio` output (the "Children" column)."""
    found = {}
    for line in lines:
        parts = line.split()
        if len(parts) >= 4 and parts[0].endswith("%") and parts[2] in ("[k]", "[.]"):
            found[parts[3]] = max(found.get(parts[3], 0.0), float(parts[0].rstrip("%")) / 100)
    return found


def shares(data, comm):
    """(samples of `comm`, {symbol: share of those samples with it on the stack})."""
    def report(*options):
        return subprocess.run(["perf", "report", "-i", data, "--stdio", "-g", "none", *options],
                              capture_output=True, text=True, check=True).stdout.splitlines()
    return (comm_samples(report("--sort", "comm", "-n"), comm),
            symbol_shares(report("--comm", comm, "--children", "--percentage", "relative",
                                 "--sort", "sym", "--percent-limit", "0.01")))


def measure(args, mode, csv_path, emails_path, out):
    log_path = os.path.join(out, f"forkserve-{mode}.log")
    server = start(args, mode, csv_path, log_path)
    data = os.path.join(out, f"perf-{mode}.data")
    try:
        before = sample_group(server.pid, False)
        perf = Group(["perf", "record", "-a", "-C", args.server_cpus, "-g", "-o", data],
                     log_path=os.path.join(out, f"perf-{mode}.log"))
        try:
            spec = wrk.LoadSpec(emails_path=emails_path, cpus=args.client_cpus)
            result = wrk.run_phase(server.url + "/", spec, args.requests, 300, out)
            after = sample_group(server.pid, False)
        finally:
            perf.stop(sig=signal.SIGINT, grace=120)  # SIGINT: perf writes its data, then exits
    finally:
        server.stop()
    answered = result.responses
    cpu = sum(s.cpu_s for s in after) - sum(s.cpu_s for s in before if s.pid in
                                            {a.pid for a in after})
    faults = (sum(s.minor_faults for s in after if s.role == "worker")
              - sum(s.minor_faults for s in before if s.role == "worker"))
    samples, found = shares(data, WORKER_COMM)
    copy = max((found.get(name, 0.0) for name in PAGE_COPIES), default=0.0)
    return dict(mode=mode, rps=result.rate, cpu_us=cpu / answered * 1e6,
                faults=faults / answered, fault=found.get(FAULT, 0.0),
                cow=found.get(COW, 0.0), copy=copy, samples=samples, answered=answered)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--modes", default="dict,share", help="comma-separated: dict,share,store")
    p.add_argument("--rows", type=int, default=300_000)
    p.add_argument("--requests", type=int, default=40_000, help="lookups per mode (40,000)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--python", default=sys.executable, help="the server's interpreter")
    p.add_argument("--server-cpus", default="0")
    p.add_argument("--client-cpus", default="1")
    p.add_argument("--data-dir", default=os.path.join(tempfile.gettempdir(), "forkserve-bench"))
    p.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "forkserve-cow"),
                   help="perf's data and the servers' logs (%(default)s)")
    p.add_argument("--result", default=os.path.join(REPO, "benchmarks", "results", "cow_cost"),
                   help="where result.json goes (%(default)s)")
    args = p.parse_args(argv)
    conditions, rows = Conditions(), []
    missing = [tool for tool in ("wrk", "taskset", "perf") if not shutil.which(tool)]
    if missing:
        p.error(f"needs {', '.join(missing)} (apt-get install wrk util-linux linux-perf)")
    os.makedirs(args.out, exist_ok=True)
    csv_path, emails_path = prepare_dataset(args.rows, args.seed, args.data_dir)
    print(f"{args.rows:,} people, forkserve -w 4 on CPU {args.server_cpus}, "
          f"{args.requests:,} lookups per mode, perf on; {args.python}\n")
    for mode in args.modes.split(","):
        r = measure(args, mode.strip(), csv_path, emails_path, args.out)
        rows.append(dict(r, us_in_faults=r["fault"] * r["cpu_us"]))
        print(f"{mode}: {r['cpu_us']:.0f} µs CPU/req, {r['fault']:.1%} in page faults",
              file=sys.stderr, flush=True)
    print("\n".join(table(rows, RESULT_COLUMNS)))
    write_result("cow_cost.py", argv, rows, conditions, args.result,
                 title=f"{args.rows:,} people, {args.requests:,} lookups per mode")


if __name__ == "__main__":
    main()
