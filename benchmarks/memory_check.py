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
import re
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.harness.machine import Conditions  # noqa: E402
from benchmarks.harness.procs import cpu_seconds  # noqa: E402
from forkserve.memory import limit  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
LISTENING = re.compile(rb"Listening at: http://127\.0\.0\.1:(\d+)")
SETTINGS = {"no limit": [], "--max-worker-memory 4096": ["--max-worker-memory", "4096"]}


def start(extra, log_path):
    log = open(log_path, "wb")
    # Not from benchmarks/: forkserve reads a gunicorn.conf.py in its working
    # directory, and the one there (the gunicorn-gc hooks) is not for this.
    env = dict(os.environ, PYTHONPATH=HERE)
    server = subprocess.Popen([sys.executable, "-m", "forkserve", "-w", "1", "-b", "127.0.0.1:0",
                               *extra, "hello_app:app"], cwd=os.path.dirname(log_path),
                              env=env, stdout=log, stderr=subprocess.STDOUT,
                              start_new_session=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with open(log_path, "rb") as handle:
            text = handle.read()
        match = LISTENING.search(text)
        children = _children(server.pid)
        if match and children and b"Booting worker" in text:
            return server, int(match.group(1)), children[0]
        time.sleep(0.1)
    server.kill()
    raise SystemExit(f"forkserve did not start:\n{open(log_path).read()}")


def _children(pid):
    with open(f"/proc/{pid}/task/{pid}/children") as handle:
        return [int(child) for child in handle.read().split()]


def measure(port, worker, seconds):
    before = cpu_seconds(worker)
    out = subprocess.run(["wrk", "-t1", "-c32", f"-d{seconds}s",
                          f"http://127.0.0.1:{port}/"], capture_output=True, text=True,
                         check=True).stdout
    used = cpu_seconds(worker) - before
    requests = int(re.search(r"(\d+) requests in", out).group(1))
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
    args = parser.parse_args(argv)
    conditions = Conditions()
    results = {name: [] for name in SETTINGS}
    servers = {}
    try:
        workdir = tempfile.mkdtemp(prefix="memory_check-")
        for name, extra in SETTINGS.items():
            servers[name] = start(extra, os.path.join(workdir, f"{len(servers)}.log"))
        for _ in range(args.rounds):
            for name, (_, port, worker) in servers.items():
                results[name].append(measure(port, worker, args.seconds))
    finally:
        for server, _, _ in servers.values():
            os.killpg(server.pid, 9)
            server.wait()
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
