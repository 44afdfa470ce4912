"""The load driver: wrk, for a counted phase of PersonDB lookups, a timed run,
or several servers loaded at once; and a latency probe beside it.

Why wrk rather than Locust: on a 2-core machine the load generator competes
with the server for CPU. wrk is C with an event loop and costs a few
microseconds per request; Locust, even with FastHttpUser, costs tens of
microseconds of Python per request, so it would need most of a core to
drive a few thousand requests per second and would become what we measure.
(examples/locustfile.py is still the tool for realistic user behaviour and
for watching memory while a test runs; see docs/locust.md.)

A phase is a fixed number of responses, not a fixed time: memory copied by
copy-on-write grows with the number of distinct rows touched, so comparing
servers after equal work is fair, and comparing after equal time would
penalise the faster server. wrk only knows durations, so benchmarks/apps/lookup.lua
counts responses, stops its thread at the quota and drops a marker file; we
then interrupt wrk (its main thread otherwise sleeps for the whole -d), and
it prints its summary. -d is kept as a time cap.
"""

import dataclasses
import glob
import http.client
import json
import os
import random
import re
import signal
import subprocess
import tempfile
import threading
import time

from benchmarks.harness.procs import Group

__all__ = ["LatencyProbe", "LoadSpec", "PhaseResult", "Summary", "Wrk", "parse_result",
           "parse_summary", "probe_paths", "run", "run_phase", "together", "version"]

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: counts PersonDB lookups to a quota (run_phase)
LUA_SCRIPT = os.path.join(HERE, "apps", "lookup.lua")
#: prints the BENCH_RESULT line of a timed run on any URL
HELLO_LUA = os.path.join(HERE, "apps", "hello.lua")

_RESULT_PREFIX = "BENCH_RESULT "


@dataclasses.dataclass(frozen=True)
class LoadSpec:
    """How to generate load; the same for every server."""

    emails_path: str
    threads: int = 1
    connections: int = 32
    miss_ratio: float = 0.05
    #: Share of requests that ask the server to close the connection. wrk
    #: keeps connections open, and a pre-fork server's workers race to
    #: accept them, so without this a few workers could hold every
    #: connection for the whole run and the others would see no traffic.
    #: Reconnecting every ~50 requests spreads the load as a real client
    #: population does, at a small cost in connects.
    close_ratio: float = 0.02
    seed: int = 1
    #: Taskset CPU list for wrk, or None to leave it unpinned.
    cpus: str | None = "1"
    request_timeout_s: int = 10


@dataclasses.dataclass(frozen=True)
class PhaseResult:
    """wrk's figures for one phase (latencies in microseconds)."""

    responses: int
    duration_s: float
    ok: int
    not_found: int
    bad_status: int
    connect_errors: int
    read_errors: int
    write_errors: int
    timeouts: int
    p50_us: int
    p90_us: int
    p99_us: int
    p999_us: int
    max_us: int
    timed_out: bool = False

    @property
    def errors(self):
        """Failed requests: statuses other than 200/404, connect and write
        errors, timeouts.

        Read errors are left out on purpose: wrk counts as one every
        connection the server closes, including the ones we asked it to
        close (close_ratio) and every connection of a server that does not
        keep connections alive. They are reported separately.
        """
        return self.bad_status + self.connect_errors + self.write_errors + self.timeouts

    @property
    def rate(self):
        return self.responses / self.duration_s if self.duration_s else 0.0


def parse_result(stdout, timed_out=False):
    """Find lookup.lua's BENCH_RESULT line in wrk's output."""
    for line in stdout.splitlines():
        if line.startswith(_RESULT_PREFIX):
            data = json.loads(line[len(_RESULT_PREFIX):])
            break
    else:
        raise ValueError("wrk printed no BENCH_RESULT line:\n" + stdout[-2000:])
    counters = {field.name: data[field.name] for field in dataclasses.fields(PhaseResult)
                if field.name in data}
    return PhaseResult(responses=data["ok"] + data["not_found"] + data["bad_status"],
                       duration_s=data["duration_us"] / 1e6, timed_out=timed_out, **counters)


def run_phase(url, spec, responses, time_cap_s, workdir, *, phase_id=0, poll_s=0.01):
    """Send ``responses`` lookups to ``url`` (at most ``time_cap_s``) and
    return the PhaseResult."""
    per_thread = -(-responses // spec.threads)  # ceiling
    done_prefix = os.path.join(workdir, f"wrk-done-{os.getpid()}-{phase_id}-")
    for stale in glob.glob(done_prefix + "*"):
        os.unlink(stale)
    env = dict(
        os.environ,
        BENCH_EMAILS=spec.emails_path,
        BENCH_QUOTA=str(per_thread),
        BENCH_DONE=done_prefix,
        BENCH_MISS_RATIO=str(spec.miss_ratio),
        BENCH_CLOSE_RATIO=str(spec.close_ratio),
        BENCH_SEED=str(spec.seed * 1000 + phase_id),
    )
    markers = [f"{done_prefix}{n}" for n in range(1, spec.threads + 1)]
    with Wrk(url, int(time_cap_s), spec.connections, spec.cpus, workdir, script=LUA_SCRIPT,
             env=env, threads=spec.threads, timeout_s=spec.request_timeout_s) as wrk:
        deadline = time.monotonic() + time_cap_s + 30
        while wrk.group.alive():
            if all(os.path.exists(m) for m in markers):
                # Every thread met its quota: end wrk's -d sleep now.
                wrk.group.send_signal(signal.SIGINT)
                break
            if time.monotonic() > deadline:
                break
            time.sleep(poll_s)
        text = wrk.output(timeout=30)
        timed_out = not all(os.path.exists(m) for m in markers)
    for path in markers:
        if os.path.exists(path):
            os.unlink(path)
    return parse_result(text, timed_out=timed_out)


class Wrk:
    """One wrk process in its own process group, its output in ``workdir``.

    ``output()`` waits for it (up to ``timeout`` s, then it is killed) and
    returns what it printed; leaving the block stops it if still running.
    """

    def __init__(self, url, seconds, connections, cpus, workdir, *, script=None, env=None,
                 threads=1, timeout_s=10):
        argv = ["wrk", f"-t{threads}", f"-c{connections}", f"-d{seconds}s",
                f"--timeout={timeout_s}s"] + (["-s", script] if script else []) + [url]
        if cpus:
            argv = ["taskset", "-c", cpus] + argv
        self.seconds = seconds
        self._out = tempfile.NamedTemporaryFile(dir=workdir, prefix="wrk-", suffix=".out")
        self.group = Group(argv, env=dict(os.environ, **(env or {})), stdout=self._out,
                           stderr=subprocess.STDOUT)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.group.stop(grace=5)
        self._out.close()

    def output(self, timeout=None):
        try:
            self.group.popen.wait(timeout=self.seconds + 30 if timeout is None else timeout)
        except subprocess.TimeoutExpired:
            self.group.stop(grace=5)
        self._out.seek(0)
        return self._out.read().decode("utf-8", "replace")


def version():
    """wrk's version, or "not installed"."""
    try:
        out = subprocess.run(["wrk", "--version"], capture_output=True, text=True).stdout
    except FileNotFoundError:
        return "not installed"
    return out.split()[1] if out.split() else "?"


def run(url, seconds, connections, cpus, workdir, script=HELLO_LUA, env=None):
    """Load ``url`` for ``seconds`` with wrk; what it printed (with hello.lua,
    a BENCH_RESULT line for parse_result)."""
    with Wrk(url, seconds, connections, cpus, workdir, script=script, env=env) as wrk:
        return wrk.output()


def together(urls, seconds, connections, cpus, workdir, script=HELLO_LUA, env=None):
    """One wrk per URL, all at once; {url: what it printed}."""
    runs = {}
    try:
        for url in urls:
            runs[url] = Wrk(url, seconds, connections, cpus, workdir, script=script, env=env)
        return {url: wrk.output() for url, wrk in runs.items()}
    finally:
        for wrk in runs.values():
            wrk.__exit__(None, None, None)


@dataclasses.dataclass(frozen=True)
class Summary:
    """The figures of wrk's own summary (a run without hello.lua or lookup.lua)."""

    requests: int
    rate: float
    non_2xx: int
    socket_errors: str

    @property
    def failed(self):
        return bool(self.non_2xx or self.socket_errors)


def parse_summary(stdout):
    """wrk's "N requests in", "Requests/sec", "Non-2xx" and "Socket errors" lines."""
    requests = re.search(r"(\d+) requests in", stdout)
    rate = re.search(r"Requests/sec:\s+([\d.]+)", stdout)
    if not (requests and rate):
        raise ValueError("wrk printed no summary:\n" + stdout[-2000:])
    non_2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", stdout)
    errors = re.search(r"Socket errors: (.*)", stdout)
    return Summary(int(requests.group(1)), float(rate.group(1)),
                   int(non_2xx.group(1)) if non_2xx else 0,
                   errors.group(1).strip() if errors else "")


class LatencyProbe:
    """Times one lookup every ``interval`` s while wrk loads the server.

    wrk reports percentiles per run, not over time, and its Lua hooks see
    responses but not which request they answer, so the latency of wrk's
    own requests cannot be put on a time axis. The probe can: it is one more
    client, sending a lookup of a known person on a new connection (so its
    requests land on every worker, as a new client's do), one at a time,
    every ``interval`` seconds or as soon as the previous one is answered
    if that takes longer, and recording (seconds since ``started``, latency in seconds,
    status or 0 for a failure). Its requests wait in the same queues as
    wrk's, so their latencies sample what wrk's requests see at that time;
    at 20 per second at most it adds well under 1% to wrk's load.
    """

    def __init__(self, port, paths, started, interval=0.05, timeout=10.0, seed=0):
        self.port, self.paths, self.started = port, paths, started
        self.interval, self.timeout = interval, timeout
        self.records = []
        self._random = random.Random(seed)
        self._finished = threading.Event()
        self._thread = None

    def __enter__(self):
        self._finished.clear()
        self._thread = threading.Thread(target=self._loop, name="latency-probe", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc_info):
        self._finished.set()
        self._thread.join()

    def _loop(self):
        next_at = time.monotonic()
        while not self._finished.is_set():
            self.records.append(self.probe_once())
            next_at += self.interval
            self._finished.wait(max(0.0, next_at - time.monotonic()))

    def probe_once(self):
        path = self._random.choice(self.paths)
        sent = time.monotonic()
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=self.timeout)
        try:
            conn.request("GET", path)
            response = conn.getresponse()
            response.read()
            status = response.status
        except (OSError, http.client.HTTPException):
            status = 0
        finally:
            conn.close()
        done = time.monotonic()
        return (round(sent - self.started, 4), round(done - sent, 6), status)


def probe_paths(emails_path, count=1000):
    """Lookup paths of the first ``count`` known people."""
    paths = []
    with open(emails_path) as f:
        for line in f:
            if line.strip():
                paths.append("/person/" + line.strip())
            if len(paths) >= count:
                break
    return paths
