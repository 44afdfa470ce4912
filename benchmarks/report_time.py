"""How long a full memory report takes: 16 workers sharing 1 GiB each.

Starts ``forkserve -w 16`` on an app holding BALLAST_MB (default 1024) of
touched memory, preloaded in the master so every worker maps all of it, then
times ``collect(discover(master))`` (what ``forkserve memory --pid`` does)
REPEAT times and prints the median and the spread, next to the same reads
made one process at a time and one process's read (the kernel's page walk,
which computes PSS, is most of the cost; model.read_processes runs the
walks of several processes at once, one per CPU).

    python -m benchmarks.report_time [--workers 16] [--ballast-mb 1024] [--repeat 15]

Writes result.json (the harness's schema) in --out.
"""

import argparse
import os
import statistics
import sys
import tempfile
import time

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.harness.machine import Conditions  # noqa: E402
from benchmarks.harness.results import write_result  # noqa: E402
from benchmarks.harness.start import start  # noqa: E402
from forkserve.memory import model, procfs  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
APPS = os.path.join(REPO, "tests", "apps")

#: the figures benchmarks/README.md shows of a run's rows (benchmarks.harness.index)
RESULT_COLUMNS = (
    ("reads", "reads"), ("median_ms", "median"), ("min_ms", "min"), ("max_ms", "max"),
)


def _time(function, repeat):
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        function()
        times.append(time.perf_counter() - started)
    return times


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--ballast-mb", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--out", default=os.path.join(REPO, "benchmarks", "results",
                                                      "report_time"),
                        help="where result.json goes (%(default)s)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        version = os.path.join(scratch, "version")
        with open(version, "w") as handle:
            handle.write("v1")
        log_path = os.path.join(scratch, "server.log")
        env = dict(os.environ, VERSION_FILE=version, BALLAST_MB=str(args.ballast_mb))
        conditions = Conditions()
        with start([sys.executable, "-m", "forkserve", "-b", "127.0.0.1:0", "-w",
                    str(args.workers), "versioned:app"], log_path=log_path, env=env, cwd=APPS,
                   processes=args.workers + 1, probe_path="/", timeout=300) as server:
            report = model.collect(model.discover(server.pid))
            assert report.process_count == args.workers + 1, report.process_count
            pids = [info.pid for info in model.discover(server.pid)]
            full = _time(lambda: model.collect(model.discover(server.pid)), args.repeat)
            serial = _time(lambda: model.read_processes(pids, threads=1), args.repeat)
            one = _time(lambda: procfs.read_process(server.pid), args.repeat)
    print(f"{args.workers} workers x {args.ballast_mb} MiB shared, {os.cpu_count()} CPUs; "
          f"{conditions.describe()}:")
    print(f"  the same reads one process at a time: median {statistics.median(serial) * 1000:.0f} ms "
          f"(min {min(serial) * 1000:.0f}, max {max(serial) * 1000:.0f})")
    print(f"  full report: median {statistics.median(full) * 1000:.0f} ms "
          f"(min {min(full) * 1000:.0f}, max {max(full) * 1000:.0f}) over {args.repeat}")
    print(f"  one process read: median {statistics.median(one) * 1000:.1f} ms; x "
          f"{args.workers + 1} processes = {statistics.median(one) * 1000 * (args.workers + 1):.0f}"
          " ms read one after another")
    rows = [{"reads": name, "median_ms": statistics.median(times) * 1000,
             "min_ms": min(times) * 1000, "max_ms": max(times) * 1000}
            for name, times in (("full report (reads at once, one thread per CPU)", full),
                                ("the same reads one process at a time", serial),
                                ("one process's read", one))]
    write_result("report_time.py", argv, rows, conditions, args.out,
                 title=f"{args.workers} workers x {args.ballast_mb} MiB, {args.repeat} times")


if __name__ == "__main__":
    main()
