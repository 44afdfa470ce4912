"""What one recycle costs the server, in CPU and page faults.

    python benchmarks/recycle_cost.py                 # 200 recycles
    python benchmarks/recycle_cost.py --requests 50 --python /path/to/python3.12

Runs forkserve `-w 1` serving benchmarks/apps/hello_app.py under `perf stat
-e page-faults,task-clock` (every process of the server: the master, each
worker, their exits) twice: with `--max-requests 1` and with 0. Each request
is on a new connection and is sent once the previous recycle is over (its
replacement serves and the old worker has exited), so every request of the
first run costs one whole recycle and nothing overlaps. A recycle's cost is
the difference of the two runs divided by the recycles. CPU time and faults
do not depend on how busy the machine is as much as wall-clock time does,
but a loaded machine still inflates them (caches, a VM's steal): say the
load average with the figures.
"""

import argparse
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def wait_for(predicate, read, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = read()
        if predicate(text):
            return text
        time.sleep(0.002)
    raise SystemExit("the server did not get there in time; its log:\n" + read()[-3000:])


def run(python, max_requests, requests):
    """(task-clock ms, page faults, recycles) of one server run."""
    with tempfile.TemporaryDirectory() as tmp:
        log_path, perf_path = os.path.join(tmp, "log"), os.path.join(tmp, "perf")
        with open(log_path, "w") as log:
            server = subprocess.Popen(
                ["perf", "stat", "-x,", "-o", perf_path, "-e", "page-faults,task-clock",
                 python, "-m", "forkserve", "-w", "1", "--max-requests", str(max_requests),
                 "-b", "127.0.0.1:0", "--log-level", "info", "hello_app:app"],
                stdout=log, stderr=log, cwd=os.path.join(HERE, "apps"), start_new_session=True)

        def read():
            with open(log_path) as file:
                return file.read()

        text = wait_for(lambda t: "Listening at" in t and "Booting worker" in t, read)
        port = int(re.search(r"Listening at: http://127\.0\.0\.1:(\d+)", text).group(1))
        for _ in range(requests):
            boots = read().count("Booting worker")
            with socket.create_connection(("127.0.0.1", port)) as conn:
                conn.sendall(b"GET / HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n")
                while conn.recv(65536):
                    pass
            if max_requests:  # the replacement serves and the old worker is gone
                wait_for(lambda t: t.count("Booting worker") > boots
                         and t.count(") exited") >= boots, read)
        os.killpg(server.pid, signal.SIGINT)
        server.wait()
        with open(perf_path) as file:
            counts = {line.split(",")[2]: float(line.split(",")[0])
                      for line in file if line.count(",") > 2}
        return counts["task-clock"], counts["page-faults"], read().count("is recycled")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--python", default=sys.executable,
                        help="the Python whose forkserve is measured (default: this one)")
    args = parser.parse_args()
    python = os.path.abspath(shutil.which(args.python) or args.python)  # run from apps/
    recycling = run(python, 1, args.requests)
    plain = run(python, 0, args.requests)
    recycles = recycling[2]
    print(f"load average {open('/proc/loadavg').read().split()[0]}; {recycles} recycles")
    print(f"--max-requests 1: {recycling[0]:.0f} ms, {recycling[1]:.0f} page faults")
    print(f"--max-requests 0: {plain[0]:.0f} ms, {plain[1]:.0f} page faults")
    print(f"one recycle: {(recycling[0] - plain[0]) / recycles:.1f} ms of CPU, "
          f"{(recycling[1] - plain[1]) / recycles:.0f} page faults")


if __name__ == "__main__":
    main()
