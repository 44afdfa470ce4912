"""What logging every request costs: forkserve with and without an access log.

    python benchmarks/accesslog.py [--rounds 3] [--seconds 10] [--workers 1]

Serves a tiny WSGI app (benchmarks/accesslog.py:app) with forkserve pinned to
CPU 0, drives it with wrk pinned to CPU 1 (keep-alive, 50 connections),
alternating "no access log" and "access log to a file in Gunicorn's default
format" for --rounds rounds each, and prints requests/s per run and the
ratio of the medians; and the server's CPU time per request (user + system
time of the master and workers from /proc, over the requests wrk completed),
which other load on the machine disturbs much less than requests/s. It
reads CPU steal from /proc/stat before and after: with other work on the
machine, say so next to the figure.
"""

import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LISTENING = re.compile(rb"Listening at: http://127\.0\.0\.1:(\d+)")


def app(environ, start_response):
    body = b"hello\n"
    start_response("200 OK", [("Content-Type", "text/plain"),
                              ("Content-Length", str(len(body)))])
    return [body]


def answers(port):
    import urllib.request
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def steal_jiffies():
    with open("/proc/stat") as handle:
        fields = handle.readline().split()
    return int(fields[8])


def start(extra, log_path):
    log = open(log_path, "w+b")
    proc = subprocess.Popen(
        ["taskset", "-c", "0", sys.executable, "-m", "forkserve", "-b", "127.0.0.1:0",
         "-w", str(ARGS.workers), *extra, "benchmarks.accesslog:app"],
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        log.seek(0)
        match = LISTENING.search(log.read())
        if match and len(children(proc.pid)) == ARGS.workers and answers(int(match.group(1))):
            return proc, int(match.group(1))
        time.sleep(0.05)
    raise SystemExit(f"forkserve did not start; see {log_path}")


def cpu_seconds(pid):
    """User + system CPU seconds of `pid` and its children (the workers)."""
    total = 0
    for process in [pid, *children(pid)]:
        with open(f"/proc/{process}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def children(pid):
    with open(f"/proc/{pid}/task/{pid}/children") as handle:
        return [int(child) for child in handle.read().split()]


def wrk(port, server_pid):
    before = cpu_seconds(server_pid)
    done = subprocess.run(["taskset", "-c", "1", "wrk", "-t1", "-c50", f"-d{ARGS.seconds}s",
                           f"http://127.0.0.1:{port}/"], capture_output=True, text=True,
                          check=True)
    used = cpu_seconds(server_pid) - before
    requests = int(re.search(r"(\d+) requests in", done.stdout).group(1))
    return (float(re.search(r"Requests/sec:\s+([\d.]+)", done.stdout).group(1)),
            used / requests * 1e6)


def run(extra, directory, name):
    proc, port = start(extra, os.path.join(directory, f"{name}.server.log"))
    try:
        return wrk(port, proc.pid)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)


def micro():
    """CPU time to build one default line and hand it to the buffered file."""
    sys.path.insert(0, ROOT)
    from forkserve import logs
    from forkserve.http.accesslog import AccessFormat
    environ = {"REMOTE_ADDR": "127.0.0.1", "REQUEST_METHOD": "GET", "PATH_INFO": "/",
               "QUERY_STRING": "", "SERVER_PROTOCOL": "HTTP/1.1", "HTTP_USER_AGENT": "wrk"}
    fmt = AccessFormat()
    with tempfile.TemporaryDirectory() as directory:
        handler = logs.AccessFileHandler(os.path.join(directory, "a.log"), encoding="utf-8")
        count = 100_000
        for _ in range(3):
            started = time.process_time()
            for _ in range(count):
                handler.write_line(fmt.line(environ, "GET / HTTP/1.1", 200, [], 6, 0.001))
            print(f"build + buffer one line: "
                  f"{(time.process_time() - started) / count * 1e6:.2f} us CPU")
        handler.close()


def main():
    if ARGS.micro:
        return micro()
    results = {"off": [], "on": []}
    cpu = {"off": [], "on": []}
    steal_before, started = steal_jiffies(), time.monotonic()
    with tempfile.TemporaryDirectory() as directory:
        access = os.path.join(directory, "access.log")
        for round_number in range(ARGS.rounds):
            for mode, extra in (("off", []), ("on", ["--access-logfile", access])):
                rate, micros = run(extra, directory, f"{mode}{round_number}")
                results[mode].append(rate)
                cpu[mode].append(micros)
            print(f"round {round_number + 1}: off {results['off'][-1]:.0f} req/s "
                  f"({cpu['off'][-1]:.1f} us CPU/req), on {results['on'][-1]:.0f} req/s "
                  f"({cpu['on'][-1]:.1f} us CPU/req)", flush=True)
        lines = sum(1 for _ in open(access))
    steal = (steal_jiffies() - steal_before) / os.sysconf("SC_CLK_TCK")
    off, on = statistics.median(results["off"]), statistics.median(results["on"])
    cpu_off, cpu_on = statistics.median(cpu["off"]), statistics.median(cpu["on"])
    print(f"median: off {off:.0f} req/s, on {on:.0f} req/s: with access log "
          f"{on / off:.3f}x requests/s; server CPU per request off {cpu_off:.1f} us, on "
          f"{cpu_on:.1f} us: {cpu_on / cpu_off:.3f}x ({(cpu_on / cpu_off - 1) * 100:.1f}% more); "
          f"{lines} lines logged; CPU steal {steal:.1f} s over {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--micro", action="store_true",
                        help="only time building and buffering lines, in this process")
    ARGS = parser.parse_args()
    main()
