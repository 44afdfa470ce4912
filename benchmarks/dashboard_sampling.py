"""What the dashboard's history costs the master: 16 workers sharing 1 GiB.

Starts two servers side by side, the same but for --stats: ``forkserve -w
WORKERS`` on an app holding BALLAST_MB of touched memory preloaded in the
master (every worker maps all of it). With --stats the master samples the
history (forkserve.memory.history: a full report, due 50 times what the
last one cost and at least a second later); without it, nothing. Over
SECONDS it compares the two masters' CPU time (utime + stime from
/proc/PID/stat), and prints the interval the sampler chose, the samples it
took, and what /json (one report) takes from a client. CPU steal and the
load average are printed: on a shared machine both masters see the same
noise, which is why they run at once. Writes result.json (the harness's
schema) in --out.

    python -m benchmarks.dashboard_sampling [--workers 16] [--ballast-mb 1024] [--seconds 60]
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import urllib.request

from benchmarks.harness.machine import Conditions
from benchmarks.harness.procs import cpu_seconds
from benchmarks.harness.results import write_result
from benchmarks.harness.start import start

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
APPS = os.path.join(REPO, "tests", "apps")
OUT = os.path.join(REPO, "benchmarks", "results", "dashboard_sampling")


def _start(scratch, name, workers, ballast_mb, stats):
    """forkserve -w workers on the ballast app, once every worker is up: a harness Server."""
    version = os.path.join(scratch, f"{name}.version")
    with open(version, "w") as handle:
        handle.write("v1")
    env = dict(os.environ, VERSION_FILE=version, BALLAST_MB=str(ballast_mb))
    args = [sys.executable, "-m", "forkserve", "-b", "127.0.0.1:0", "-w", str(workers)]
    args += ["--stats", "127.0.0.1:0"] if stats else []
    return start([*args, "versioned:app"], log_path=os.path.join(scratch, f"{name}.log"),
                 env=env, cwd=APPS, processes=workers + 1, probe_path="/", timeout=300)


def _get(port, path):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=60) as response:
        return response.read()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--ballast-mb", type=int, default=1024)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--out", default=OUT, help="where result.json goes")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        with _start(scratch, "stats", args.workers, args.ballast_mb, True) as sampled, \
                _start(scratch, "plain", args.workers, args.ballast_mb, False) as plain:
            port = sampled.stats_port()
            cpu = {pid: cpu_seconds(pid) for pid in (sampled.pid, plain.pid)}
            conditions, started, begin = Conditions(), time.monotonic(), time.time()
            time.sleep(args.seconds)  # a measuring period, not synchronisation
            end, elapsed = time.time(), time.monotonic() - started
            used = {pid: cpu_seconds(pid) - before for pid, before in cpu.items()}
            conditions.end()
            history = json.loads(_get(port, "/history"))
            samples = sum(begin <= point["t"] <= end for point in history["points"])
            # What one report costs the master: five of them, asked for at once
            # after the other (a sample due meanwhile would count too).
            reports, cpu_before = [], cpu_seconds(sampled.pid)
            for _ in range(5):
                begun = time.perf_counter()
                _get(port, "/json")
                reports.append(time.perf_counter() - begun)
            report_cpu = (cpu_seconds(sampled.pid) - cpu_before) / len(reports)
    rows = [{"server": "forkserve --stats (history sampled)", "master_cpu_s": round(
                 used[sampled.pid], 3), "samples": samples,
             "interval_s": round(history["interval"], 2),
             "report_ms_median": round(statistics.median(reports) * 1000),
             "report_cpu_ms": round(report_cpu * 1000)},
            {"server": "forkserve (no --stats)", "master_cpu_s": round(used[plain.pid], 3)}]
    write_result("dashboard_sampling.py", argv, rows, conditions, args.out,
                 title=f"history sampling, {args.workers} workers x {args.ballast_mb} MiB, "
                 f"{elapsed:.0f} s")
    print(f"{args.workers} workers x {args.ballast_mb} MiB shared, {os.cpu_count()} CPUs, "
          f"{elapsed:.0f} s; {conditions.describe()}")
    print(f"  master CPU with --stats (sampling): {used[sampled.pid]:.2f} s "
          f"({100 * used[sampled.pid] / elapsed:.1f}% of one CPU)")
    print(f"  master CPU without --stats:          {used[plain.pid]:.2f} s "
          f"({100 * used[plain.pid] / elapsed:.1f}% of one CPU)")
    print(f"  samples taken: {samples} (one every {elapsed / max(1, samples):.1f} s); "
          f"interval chosen at the end: {history['interval']:.1f} s")
    print(f"  one report from a client (GET /json): median "
          f"{statistics.median(reports) * 1000:.0f} ms (min {min(reports) * 1000:.0f}, "
          f"max {max(reports) * 1000:.0f}) over {len(reports)}; master CPU per report "
          f"{report_cpu * 1000:.0f} ms")


if __name__ == "__main__":
    main()
