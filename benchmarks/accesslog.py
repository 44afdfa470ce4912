"""What logging every request costs: forkserve with and without an access log.

    python benchmarks/accesslog.py --rounds 15 --seconds 2 --workers 1
    python benchmarks/accesslog.py --micro
    python benchmarks/accesslog.py --quick            # 2 rounds x 1 s

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
the machine, say so next to the figure. Writes result.json (the harness's
schema: each round and the medians) in --out.

--micro times logging one request in the default format, formatted at once
or captured and rendered when written, in a loop in this process.
"""

import argparse
import os
import statistics
import sys
import tempfile
import time

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.harness import wrk as load  # noqa: E402
from benchmarks.harness.machine import Conditions, add_common_options, parse_quick  # noqa: E402
from benchmarks.harness.procs import group_cpu_seconds  # noqa: E402
from benchmarks.harness.results import write_result  # noqa: E402
from benchmarks.harness.start import start as start_server  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUICK = {"rounds": 2, "seconds": 1}


def app(environ, start_response):
    body = b"hello\n"
    start_response("200 OK", [("Content-Type", "text/plain"),
                              ("Content-Length", str(len(body)))])
    return [body]


def start(extra, log_path):
    return start_server([ARGS.python, "-m", "forkserve", "-b", "127.0.0.1:0",
                         "-w", str(ARGS.workers), *extra, "benchmarks.accesslog:app"],
                        log_path=log_path, cwd=ROOT, cpus="0", processes=1 + ARGS.workers,
                        probe_path="/", timeout=30)


def _result(text, used):
    """(requests/s, server CPU us per request) of one wrk run."""
    summary = load.parse_summary(text)
    return summary.rate, used / summary.requests * 1e6


def wrk(server, workdir):
    """One wrk run against one server: (requests/s, server CPU us per request)."""
    before = group_cpu_seconds(server.pid)
    text = load.run(server.url + "/", ARGS.seconds, 50, "1", workdir, script=None)
    return _result(text, group_cpu_seconds(server.pid) - before)


def wrk_together(servers, workdir):
    """wrk against every server at once: {mode: (requests/s, CPU us per request)}."""
    before = {mode: group_cpu_seconds(server.pid) for mode, server in servers.items()}
    outputs = load.together([server.url + "/" for server in servers.values()], ARGS.seconds,
                            50, "1", workdir, script=None)
    return {mode: _result(outputs[server.url + "/"], group_cpu_seconds(server.pid) - before[mode])
            for mode, server in servers.items()}


def micro():
    """CPU time per request to log it in the default format, both ways."""
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
    ratios, cpu_ratios, rows = [], [], []
    conditions, started = Conditions(), time.monotonic()
    with tempfile.TemporaryDirectory() as directory:
        access = os.path.join(directory, "access.log")
        servers = {mode: start(extra, os.path.join(directory, f"{mode}.server.log"))
                   for mode, extra in (("off", []), ("on", ["--access-logfile", access]))}
        try:
            for round_number in range(ARGS.rounds):
                if ARGS.method == "together":
                    measured = wrk_together(servers, directory)
                else:
                    measured = {}
                    # Alternate which goes first, so a drift favours neither.
                    for mode in ("off", "on") if round_number % 2 == 0 else ("on", "off"):
                        measured[mode] = wrk(servers[mode], directory)
                (off, cpu_off), (on, cpu_on) = measured["off"], measured["on"]
                ratios.append(on / off)
                cpu_ratios.append(cpu_on / cpu_off)
                rows.append({"round": round_number + 1, "rps_off": off, "rps_on": on,
                             "rps_ratio": on / off, "cpu_us_off": cpu_off, "cpu_us_on": cpu_on,
                             "cpu_ratio": cpu_on / cpu_off})
                print(f"round {round_number + 1}: off {off:.0f} req/s ({cpu_off:.1f} us CPU/req),"
                      f" on {on:.0f} req/s ({cpu_on:.1f} us CPU/req): {on / off:.3f}x",
                      flush=True)
        finally:
            for server in servers.values():
                server.stop(grace=30)
        lines = sum(1 for _ in open(access))
    ratio, cpu_ratio = statistics.median(ratios), statistics.median(cpu_ratios)
    print(f"median of {ARGS.rounds} rounds: with access log {ratio:.3f}x requests/s "
          f"(rounds {min(ratios):.3f}-{max(ratios):.3f}); server CPU per request {cpu_ratio:.3f}x "
          f"({(cpu_ratio - 1) * 100:+.1f}%); {lines} lines logged in "
          f"{time.monotonic() - started:.0f} s; {conditions.describe()}")
    rows.append({"round": "median", "rps_ratio": ratio, "cpu_ratio": cpu_ratio})
    write_result("accesslog.py", sys.argv[1:], rows, conditions, ARGS.out,
                 title=f"access log on/off, {ARGS.method}", note=f"{lines:,} lines logged.")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--seconds", type=int, default=2)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--method", choices=("together", "in-turn"), default="together",
                        help="load both servers at once (default) or one after the other")
    parser.add_argument("--micro", action="store_true",
                        help="only time building and buffering lines, in this process")
    parser.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "accesslog"),
                        help="where result.json goes (%(default)s)")
    add_common_options(parser, QUICK)
    ARGS = parse_quick(parser, None, QUICK)
    main()
