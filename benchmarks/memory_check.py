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
Writes result.json (the harness's schema) in --out; needs wrk.
"""

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.harness import wrk  # noqa: E402
from benchmarks.harness.machine import Conditions  # noqa: E402
from benchmarks.harness.procs import cpu_seconds  # noqa: E402
from benchmarks.harness.results import write_result  # noqa: E402
from benchmarks.harness.servers import HERE  # noqa: E402
from benchmarks.harness.start import start  # noqa: E402
from forkserve.memory import limit  # noqa: E402

OUT = os.path.join(HERE, "results", "memory_check")
SETTINGS = {"no limit": [], "--max-worker-memory 4096": ["--max-worker-memory", "4096"]}


def start_server(extra, workdir, number):
    """forkserve -w 1 on the hello app, once its worker serves; (Server, the worker's pid)."""
    # Not from benchmarks/: forkserve reads a gunicorn.conf.py in its working
    # directory, and the one there (the gunicorn-gc hooks) is not for this.
    server = start([sys.executable, "-m", "forkserve", "-w", "1", "-b", "127.0.0.1:0", *extra,
                    "hello_app:app"], log_path=os.path.join(workdir, f"{number}.log"),
                   env=dict(os.environ, PYTHONPATH=HERE), cwd=workdir, processes=2,
                   probe_path="/")
    return server, next(pid for pid in server.members() if pid != server.pid)


def measure(server, worker, seconds, workdir):
    """(worker CPU µs per response, responses a second) of one wrk run."""
    before = cpu_seconds(worker)
    out = wrk.run(server.url + "/", seconds, 32, None, workdir, script=None)
    used = cpu_seconds(worker) - before
    requests = wrk.parse_summary(out).requests
    return used / requests * 1e6, requests / seconds


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
    parser.add_argument("--out", default=OUT, help="where result.json goes (%(default)s)")
    args = parser.parse_args(argv)
    conditions = Conditions()
    results = {name: [] for name in SETTINGS}
    servers = {}
    with tempfile.TemporaryDirectory(prefix="memory_check-") as workdir:
        try:
            for name, extra in SETTINGS.items():
                servers[name] = start_server(extra, workdir, len(servers))
            for _ in range(args.rounds):
                for name, (server, worker) in servers.items():
                    results[name].append(measure(server, worker, args.seconds, workdir))
        finally:
            for server, _ in servers.values():
                server.stop(grace=5)
    conditions.end()
    alone = check_alone()
    rows = [{"setting": name, "cpu_us": statistics.median(r[0] for r in rounds),
             "rounds_cpu_us": [round(r[0], 1) for r in rounds],
             "rps": statistics.median(r[1] for r in rounds)}
            for name, rounds in results.items()]
    rows.append({"setting": "the check alone, in this process", "cpu_us": alone})
    write_result("memory_check.py", argv, rows, conditions, args.out,
                 title="--max-worker-memory's check")
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} CPUs, "
          f"{conditions.describe()}")
    print("| setting | worker CPU per response (us), each round | median | req/s median |")
    print("|---|---|---|---|")
    for row in rows[:-1]:
        print(f"| {row['setting']} | {', '.join(f'{x:.1f}' for x in row['rounds_cpu_us'])} "
              f"| {row['cpu_us']:.1f} | {row['rps']:.0f} |")
    limited, plain = rows[1]["cpu_us"], rows[0]["cpu_us"]
    print(f"\nratio with/without the limit: {limited / plain:.3f} (median CPU per response)")
    print(f"the check alone (statm pread + parse), timed in this process: {alone:.2f} us a call")


if __name__ == "__main__":
    main()
