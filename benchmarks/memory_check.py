"""What --max-worker-memory's per-request check costs a worker.

    python benchmarks/memory_check.py            # 3 rounds of 5 s per setting
    python benchmarks/memory_check.py --seconds 3 --rounds 2

Starts ``python -m forkserve -w 1`` on the hello app twice, without the
limit and with ``--max-worker-memory 4096`` (far above what it uses, so only
the cheap statm reading runs, as for any worker under its limit), saturates
each with wrk for the same time in alternating rounds, and reports the
worker's CPU time per response (/proc/PID/stat), the ratio of the two, and
the check alone timed in this process (memory.limit.MemoryLimit.over with
the real statm reader). CPU per response, not requests per second: it is
what the check adds, and less disturbed by other load on a shared machine.
Needs wrk.
"""

import argparse
import os
import sys
import tempfile
import time

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.harness import wrk  # noqa: E402
from benchmarks.harness.machine import Conditions  # noqa: E402
from benchmarks.harness.procs import cpu_seconds  # noqa: E402
from benchmarks.harness.servers import HELLO_APP  # noqa: E402
from benchmarks.harness.start import start  # noqa: E402
from forkserve.memory import limit  # noqa: E402

SETTINGS = {"no limit": [], "--max-worker-memory 4096": ["--max-worker-memory", "4096"]}


def start_server(extra, log_path):
    """forkserve -w 1 on the hello app: (harness Server, its worker's pid)."""
    server = start([sys.executable, "-m", "forkserve", "-w", "1", "-b", "127.0.0.1:0",
                    *extra, HELLO_APP], log_path=log_path, processes=2, probe_path="/",
                   timeout=30)
    return server, next(pid for pid in server.members() if pid != server.pid)


def measure(server, worker, seconds, workdir):
    before = cpu_seconds(worker)
    summary = wrk.parse_summary(wrk.run(server.url + "/", seconds, 32, None, workdir,
                                        script=None))
    used = cpu_seconds(worker) - before
    return used / summary.requests * 1e6, summary.requests / seconds


def check_alone(calls=200_000):
    read, fd = limit.statm_reader(os.getpid())
    check = limit.MemoryLimit(4096 * 2**20, read, lambda: None)
    started = time.perf_counter()
    for _ in range(calls):
        check.over()
    elapsed = time.perf_counter() - started
    os.close(fd)
    return elapsed / calls * 1e6


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    conditions = Conditions()
    results = {name: [] for name in SETTINGS}
    servers = {}
    with tempfile.TemporaryDirectory(prefix="forkserve-memory-check-") as workdir:
        try:
            for name, extra in SETTINGS.items():
                servers[name] = start_server(extra, os.path.join(workdir, f"{len(servers)}.log"))
            for _ in range(args.rounds):
                for name, (server, worker) in servers.items():
                    results[name].append(measure(server, worker, args.seconds, workdir))
        finally:
            for server, _ in servers.values():
                server.stop()
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} CPUs, "
          f"{conditions.describe()}")
    print("| setting | worker CPU per response (us), each round | median | req/s median |")
    print("|---|---|---|---|")
    medians = {}
    for name, rounds in results.items():
        cpu = sorted(r[0] for r in rounds)
        rate = sorted(r[1] for r in rounds)
        medians[name] = cpu[len(cpu) // 2]
        print(f"| {name} | {', '.join(f'{r[0]:.1f}' for r in rounds)} | {medians[name]:.1f} "
              f"| {rate[len(rate) // 2]:.0f} |")
    limited, plain = medians["--max-worker-memory 4096"], medians["no limit"]
    print(f"\nratio with/without the limit: {limited / plain:.3f} (median CPU per response)")
    print(f"the check alone (statm pread + parse), timed in this process: "
          f"{check_alone():.2f} us a call")


if __name__ == "__main__":
    main()
