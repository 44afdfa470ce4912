"""What logging every request costs: forkserve with and without an access log.

    python benchmarks/accesslog.py [--rounds 15] [--seconds 2] [--workers 1]
    python benchmarks/accesslog.py --micro

Serves a tiny WSGI app (benchmarks/accesslog.py:app) from two forkserve
servers started side by side, both pinned to CPU 0: one without an access
log, one logging to a file in Gunicorn's default format. Each round, two wrk
processes pinned to CPU 1 (keep-alive, 50 connections each) load both
servers at once for --seconds; the kernel shares CPU 0 evenly between the
two busy servers, so the ratio of their requests/s is the inverse ratio of
their CPU cost per request, measured under the same conditions at every
instant. On a shared VM the rate of one configuration swings by a third
from one minute to the next, and a ratio of two runs made apart measures
the neighbours (--method in-turn does that, alternating which goes first,
for comparison). It prints each round's requests/s and the server's CPU
time per request (user + system time of master and workers from /proc,
over the requests wrk completed), then the median of the per-round ratios.
It reads CPU steal from /proc/stat before and after: with other work on
the machine, say so next to the figure.

--micro times logging one request in the default format, formatted at once
or captured and rendered when written, in a loop in this process.
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


def _wrk_command(port):
    return ["taskset", "-c", "1", "wrk", "-t1", "-c50", f"-d{ARGS.seconds}s",
            f"http://127.0.0.1:{port}/"]


def _wrk_result(stdout, used):
    requests = int(re.search(r"(\d+) requests in", stdout).group(1))
    return float(re.search(r"Requests/sec:\s+([\d.]+)", stdout).group(1)), used / requests * 1e6


def wrk(port, server_pid):
    """One wrk run against one server: (requests/s, server CPU us per request)."""
    before = cpu_seconds(server_pid)
    done = subprocess.run(_wrk_command(port), capture_output=True, text=True, check=True)
    return _wrk_result(done.stdout, cpu_seconds(server_pid) - before)


def wrk_together(servers):
    """wrk against every server at once: {mode: (requests/s, CPU us per request)}."""
    before = {mode: cpu_seconds(proc.pid) for mode, (proc, _) in servers.items()}
    running = {mode: subprocess.Popen(_wrk_command(port), stdout=subprocess.PIPE, text=True)
               for mode, (_, port) in servers.items()}
    outputs = {mode: run.communicate()[0] for mode, run in running.items()}
    if any(run.returncode for run in running.values()):
        raise SystemExit(f"wrk failed: {outputs}")
    return {mode: _wrk_result(outputs[mode], cpu_seconds(servers[mode][0].pid) - before[mode])
            for mode in servers}


def micro():
    """CPU time per request to log it in the default format, both ways."""
    sys.path.insert(0, ROOT)
    from forkserve import logs
    from forkserve.http.accesslog import AccessFormat, capture
    environ = {"REMOTE_ADDR": "127.0.0.1", "REQUEST_METHOD": "GET", "PATH_INFO": "/",
               "QUERY_STRING": "", "SERVER_PROTOCOL": "HTTP/1.1", "HTTP_USER_AGENT": "wrk"}
    fmt = AccessFormat()
    with tempfile.TemporaryDirectory() as directory:
        handler = logs.AccessFileHandler(os.path.join(directory, "a.log"), encoding="utf-8")
        handler.render = fmt.render_all
        ways = {
            "format each line, queue it": lambda: handler.add(
                fmt.line(environ, "GET / HTTP/1.1", 200, [], 6, 0.001)),
            "capture, render when written": lambda: handler.add(
                capture(environ, "GET / HTTP/1.1", 200, 6)),
        }
        count = 100_000
        for _ in range(3):
            for name, way in ways.items():
                started = time.process_time()
                for _ in range(count):
                    way()
                handler.flush()
                print(f"{name}: {(time.process_time() - started) / count * 1e6:.2f} us CPU "
                      "(a loop: warm caches; amid real requests it costs more)")
        handler.close()


def main():
    if ARGS.micro:
        return micro()
    ratios, cpu_ratios = [], []
    steal_before, started = steal_jiffies(), time.monotonic()
    with tempfile.TemporaryDirectory() as directory:
        access = os.path.join(directory, "access.log")
        servers = {mode: start(extra, os.path.join(directory, f"{mode}.server.log"))
                   for mode, extra in (("off", []), ("on", ["--access-logfile", access]))}
        try:
            for round_number in range(ARGS.rounds):
                if ARGS.method == "together":
                    measured = wrk_together(servers)
                else:
                    measured = {}
                    # Alternate which goes first, so a drift favours neither.
                    for mode in ("off", "on") if round_number % 2 == 0 else ("on", "off"):
                        measured[mode] = wrk(servers[mode][1], servers[mode][0].pid)
                (off, cpu_off), (on, cpu_on) = measured["off"], measured["on"]
                ratios.append(on / off)
                cpu_ratios.append(cpu_on / cpu_off)
                print(f"round {round_number + 1}: off {off:.0f} req/s ({cpu_off:.1f} us CPU/req),"
                      f" on {on:.0f} req/s ({cpu_on:.1f} us CPU/req): {on / off:.3f}x",
                      flush=True)
        finally:
            for proc, _ in servers.values():
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(30)
        lines = sum(1 for _ in open(access))
    steal = (steal_jiffies() - steal_before) / os.sysconf("SC_CLK_TCK")
    ratio, cpu_ratio = statistics.median(ratios), statistics.median(cpu_ratios)
    print(f"median of {ARGS.rounds} rounds: with access log {ratio:.3f}x requests/s "
          f"(rounds {min(ratios):.3f}-{max(ratios):.3f}); server CPU per request {cpu_ratio:.3f}x "
          f"({(cpu_ratio - 1) * 100:+.1f}%); {lines} lines logged; CPU steal {steal:.1f} s over "
          f"{time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--seconds", type=int, default=2)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--method", choices=("together", "in-turn"), default="together",
                        help="load both servers at once (default) or one after the other")
    parser.add_argument("--micro", action="store_true",
                        help="only time building and buffering lines, in this process")
    ARGS = parser.parse_args()
    main()
