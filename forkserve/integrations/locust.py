"""Record forkserve's memory while Locust runs: a Locust plugin.

Imported by examples/locustfile.py (or add it to any locustfile with
``locust -f yourfile.py,forkserve/integrations/locust.py``). It adds options:

``--forkserve-app MODULE:APP``
    Start ``forkserve -w N -b 127.0.0.1:0 --stats 127.0.0.1:0 MODULE:APP``
    for the run, point Locust at it, and stop it when Locust quits. The
    environment (PERSONDB_CSV, PERSONDB_MODE...) passes through. With
    ``--forkserve-workers N`` (default 4) and ``--forkserve-args "..."`` for
    any other forkserve options.
``--forkserve-stats HOST:PORT``
    Or sample a forkserve you started yourself with ``--stats HOST:PORT``.
``--forkserve-interval SECONDS``
    Time between samples (default 2).

While the test runs it reads the stats endpoint's JSON (per process RSS,
PSS, USS, faults, requests) every interval and writes, next to Locust's
``--csv PREFIX`` files, ``PREFIX_memory.csv`` (without ``--csv``, a
``forkserve-memory-*.csv`` in the temporary directory): one row per process
per sample, plus a ``total`` row, each with Locust's request count at that
moment. The web UI gets a "forkserve memory" tab with the latest sample,
and a download link for the CSV (``/forkserve/memory.csv``). On Ctrl-C (or
when ``-t`` ends) the users stop first, then the server it started, so the
server's stop causes no failures. At the end it prints the last reading in
``forkserve memory``'s table format and how much each worker grew.

Copy-on-write under load, in one command (from the repository root):

    PERSONDB_CSV=out/people.csv PERSONDB_MODE=dict \\
    locust -f examples/locustfile.py --headless -u 50 -r 50 -t 60s \\
        --csv out/cow --forkserve-app examples.persondb.app:app

Run it again with PERSONDB_MODE=share or store and compare
out/cow_memory.csv: in dict mode the workers' USS grows towards the
master's RSS as lookups touch more rows; with share or store it stays flat.
"""

import atexit
import csv
import ctypes
import json
import logging
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

import gevent
from locust import events
from locust.runners import WorkerRunner

__all__ = ["MemorySampler", "rows_for_csv"]

log = logging.getLogger("locust_memory")

#: the directory holding the forkserve package (forkserve/integrations/locust.py
#: is two levels down); not forkserve/ itself, whose http/ would hide the stdlib's
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CSV_FIELDS = (
    "time", "elapsed_s", "locust_requests", "locust_failures", "locust_rps", "users",
    "pid", "role", "worker_id", "generation", "state", "server_requests",
    "rss", "pss", "private", "file", "uss", "shared", "swap", "minor_faults", "major_faults",
)

# Sizes per process; "private" is anonymous (copies, what --max-worker-memory
# limits), "file" resident file-backed pages (page cache): forkserve.memory.model.
_PROCESS_KEYS = ("rss", "pss", "private", "file", "uss", "shared", "swap", "minor_faults",
                 "major_faults")

#: Seconds forkserve gets to load the app and start listening.
START_TIMEOUT = 300

_LISTENING = re.compile(r"Listening at: (http://[\d.]+:\d+)")
_STATS = re.compile(r"Stats at: http://([\d.]+:\d+)")

MIB = 1024 * 1024


@events.init_command_line_parser.add_listener
def _add_options(parser):
    # On the parser itself: only Locust's parser knows include_in_web_ui.
    group = parser
    group.add_argument("--forkserve-app", metavar="MODULE:APP", default="",
                       env_var="FORKSERVE_APP", include_in_web_ui=False,
                       help="start forkserve with this app for the run and sample its memory")
    group.add_argument("--forkserve-workers", type=int, default=4, env_var="FORKSERVE_WORKERS",
                       include_in_web_ui=False, help="workers for --forkserve-app (default 4)")
    group.add_argument("--forkserve-args", default="", env_var="FORKSERVE_ARGS",
                       include_in_web_ui=False,
                       help="more forkserve options for --forkserve-app, as one string")
    group.add_argument("--forkserve-stats", metavar="HOST:PORT", default="",
                       env_var="FORKSERVE_STATS", include_in_web_ui=False,
                       help="sample a running forkserve's stats endpoint (its --stats address)")
    group.add_argument("--forkserve-interval", type=float, default=2.0,
                       env_var="FORKSERVE_INTERVAL", include_in_web_ui=False,
                       help="seconds between memory samples (default 2)")


def rows_for_csv(report, now, elapsed, locust_stats):
    """CSV rows for one stats-endpoint reading (forkserve.memory JSON)."""
    common = {"time": f"{now:.3f}", "elapsed_s": f"{elapsed:.1f}", **locust_stats}
    rows = []
    for p in report["processes"]:
        rows.append({
            **common, "pid": p["pid"], "role": p["role"], "worker_id": p.get("worker_id"),
            "generation": p.get("generation"), "state": p.get("state"),
            "server_requests": p.get("requests"),
            **{key: p.get(key) for key in _PROCESS_KEYS},
        })
    totals = report["totals"]
    rows.append({
        **common, "pid": "", "role": "total", "worker_id": "",
        "server_requests": totals.get("requests"),
        "rss": totals.get("rss"), "pss": totals.get("pss"), "uss": totals.get("uss"),
        "private": totals.get("private"), "file": totals.get("file"),
        "shared": sum(p.get("shared") or 0 for p in report["processes"]),
        "swap": totals.get("swap"), "minor_faults": totals.get("minor_faults"),
        "major_faults": totals.get("major_faults"),
    })
    return rows


def _ui_rows(report):
    """The latest reading as rows for the web UI tab."""
    rows = []
    for p in report["processes"] + [dict(report["totals"], role="total", pid="")]:
        label = p["role"] if p.get("worker_id") is None else f"{p['role']} {p['worker_id']}"
        rows.append({
            "name": label, "pid": p.get("pid", ""),
            "requests": p.get("requests") if p.get("requests") is not None else "",
            "rss_mib": round((p.get("rss") or 0) / MIB, 1),
            "pss_mib": round((p.get("pss") or 0) / MIB, 1),
            "private_mib": round((p.get("private") or 0) / MIB, 1),
            "file_mib": round((p.get("file") or 0) / MIB, 1),
            "minor_faults": p.get("minor_faults", ""),
        })
    return rows


class MemorySampler:
    """Reads the stats endpoint every interval and appends to the CSV."""

    def __init__(self, environment, stats_address, interval, csv_path):
        self.environment = environment
        # Figures taken since the sample before: the endpoint otherwise
        # answers at its own pace, which may be slower than ours.
        self.url = f"http://{stats_address}/json?max_age={interval / 2:g}"
        self.interval = interval
        self.csv_path = csv_path
        self.first = None
        self.latest = None
        self.started = time.monotonic()
        self._greenlet = None
        self._file = open(csv_path, "w", newline="") if csv_path else None
        self._writer = None
        if self._file:
            self._writer = csv.DictWriter(self._file, fieldnames=CSV_FIELDS, lineterminator="\n")
            self._writer.writeheader()

    def read(self):
        with urllib.request.urlopen(self.url, timeout=5) as response:
            return json.load(response)

    def sample(self):
        try:
            report = self.read()
        except (OSError, ValueError) as exc:  # URLError is an OSError
            log.warning("forkserve stats at %s: %s", self.url, exc)
            return None
        total = self.environment.stats.total
        locust_stats = {
            "locust_requests": total.num_requests,
            "locust_failures": total.num_failures,
            "locust_rps": f"{total.current_rps:.1f}",
            "users": self.environment.runner.user_count if self.environment.runner else 0,
        }
        if self.first is None:
            self.first = report
        self.latest = report
        if self._writer:
            self._writer.writerows(rows_for_csv(
                report, time.time(), time.monotonic() - self.started, locust_stats))
            self._file.flush()
        return report

    def start(self):
        if self._greenlet is None:
            self._greenlet = gevent.spawn(self._loop)

    def stop(self):
        if self._greenlet is not None:
            self._greenlet.kill()
            self._greenlet = None
        self.sample()

    def close(self):
        if self._file and not self._file.closed:
            self._file.close()

    def _loop(self):
        while True:
            self.sample()
            gevent.sleep(self.interval)

    def summary(self):
        """The last reading as forkserve's table, plus per-worker growth."""
        if self.latest is None:
            return "forkserve memory: no sample was taken"
        from forkserve.memory import render, report_json

        lines = [render.format_table(report_json.from_json(self.latest))]
        before = {p["pid"]: p for p in self.first["processes"]}
        for p in self.latest["processes"]:
            if p["role"] == "worker" and p["pid"] in before:
                grown = (p["private"] - before[p["pid"]]["private"]) / MIB
                lines.append(f"worker {p.get('worker_id')} (pid {p['pid']}): private memory "
                             f"grew {grown:+,.1f} MiB during the test")
        if self.csv_path:
            lines.append(f"samples: {self.csv_path}")
        return "\n".join(lines)


class ForkserveProcess:
    """forkserve started for the run, in its own process group."""

    def __init__(self, app, workers, extra, log_path):
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO, env.get("PYTHONPATH")]))
        argv = [sys.executable, "-m", "forkserve", "-w", str(workers),
                "-b", "127.0.0.1:0", "--stats", "127.0.0.1:0", *shlex.split(extra), app]
        self.log_path = log_path
        self._log = open(log_path, "wb")
        self.popen = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL, env=env, start_new_session=True,
                                      preexec_fn=_term_when_parent_dies)
        # Whatever way Locust ends (a second Ctrl-C interrupts stop(), an
        # uncaught error), the server must not outlive it.
        atexit.register(self.kill_now)
        log.info("started %s (log: %s)", shlex.join(argv), log_path)

    def wait_ready(self, timeout=START_TIMEOUT):
        """(base URL, stats HOST:PORT) once forkserve has logged both."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with open(self.log_path, encoding="utf-8", errors="replace") as f:
                text = f.read()
            url, stats = _LISTENING.search(text), _STATS.search(text)
            if url and stats:
                return url.group(1), stats.group(1)
            if self.popen.poll() is not None:
                tail = "\n".join(text.strip().splitlines()[-15:])
                raise RuntimeError(f"forkserve exited with status {self.popen.returncode}:\n{tail}")
            gevent.sleep(0.1)
        raise RuntimeError(f"forkserve did not start within {timeout}s; see {self.log_path}")

    def stop(self, grace=20):
        """TERM the group (graceful stop), KILL whatever remains after ``grace`` s.
        Interrupted (another Ctrl-C), it still KILLs the group before giving way."""
        try:
            os.killpg(self.popen.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            self.popen.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
        finally:
            self.kill_now()

    def kill_now(self):
        """KILL the whole group (master and workers) now; safe to call again."""
        if self.popen.returncode is not None and self._log.closed:
            return  # done already: the group id may belong to someone else by now
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.popen.wait()
        if not self._log.closed:
            self._log.close()


def _term_when_parent_dies():
    """In the forked child, before exec: SIGTERM when Locust's process ends,
    even by SIGKILL (Linux prctl PR_SET_PDEATHSIG)."""
    PR_SET_PDEATHSIG = 1
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass  # not Linux: atexit and stop() still end the server


_state = {}


def _scratch_file(prefix, suffix):
    """A new file in the temporary directory (kept: its path is printed)."""
    handle, path = tempfile.mkstemp(prefix=prefix, suffix=suffix)
    os.close(handle)
    return path


@events.init.add_listener
def _on_init(environment, **_kwargs):
    options = environment.parsed_options
    if options is None or isinstance(environment.runner, WorkerRunner):
        return  # distributed workers: the master samples
    stats_address = options.forkserve_stats
    prefix = options.csv_prefix
    if options.forkserve_app:
        log_path = f"{prefix}_forkserve.log" if prefix else _scratch_file("forkserve-", ".log")
        server = ForkserveProcess(options.forkserve_app, options.forkserve_workers,
                                  options.forkserve_args, log_path)
        _state["server"] = server
        try:
            url, stats_address = server.wait_ready()
        except RuntimeError as exc:
            server.stop()
            sys.exit(f"locust_memory: {exc}")
        environment.host = url
        options.host = url
        log.info("forkserve is serving at %s, stats at %s", url, stats_address)
    if not stats_address:
        return
    # Without --csv the samples still go to a file, so the web UI's download
    # (/forkserve/memory.csv) and the summary's pointer always work.
    csv_path = f"{prefix}_memory.csv" if prefix else _scratch_file("forkserve-memory-", ".csv")
    sampler = MemorySampler(environment, stats_address, options.forkserve_interval, csv_path)
    _state["sampler"] = sampler
    if sampler.sample() is None:
        log.warning("no forkserve stats at %s yet; will keep trying", stats_address)
    if environment.web_ui:
        _extend_web_ui(environment.web_ui, sampler)


@events.test_start.add_listener
def _on_test_start(environment, **_kwargs):
    if "sampler" in _state:
        _state["sampler"].start()


@events.test_stop.add_listener
def _on_test_stop(environment, **_kwargs):
    if "sampler" in _state:
        _state["sampler"].stop()


@events.quitting.add_listener
def _on_quitting(environment, **_kwargs):
    if "server" in _state and environment.runner is not None:
        # Locust fires `quitting` (Ctrl-C, -t ending) before it stops the
        # users: stop them first, so none sends to a server that is stopping
        # and records its refusal as a failure of the run.
        environment.runner.stop()
    sampler = _state.pop("sampler", None)
    if sampler is not None:
        sampler.stop()
        sampler.close()
        print(sampler.summary(), file=sys.stderr, flush=True)
    server = _state.pop("server", None)
    if server is not None:
        server.stop()


def _extend_web_ui(web_ui, sampler):
    from flask import Response, request

    key = "forkserve-memory"
    web_ui.template_args["extended_tabs"] = [{"title": "forkserve memory", "key": key}]
    web_ui.template_args["extended_tables"] = [{"key": key, "structure": [
        {"key": "name", "title": "process"},
        {"key": "pid", "title": "pid"},
        {"key": "requests", "title": "requests"},
        {"key": "rss_mib", "title": "RSS (MiB)"},
        {"key": "pss_mib", "title": "PSS (MiB)"},
        {"key": "private_mib", "title": "private (MiB)"},
        {"key": "file_mib", "title": "file (MiB)"},
        {"key": "minor_faults", "title": "minor faults"},
    ]}]
    web_ui.template_args["extended_csv_files"] = [
        {"href": "./forkserve/memory.csv", "title": "Download forkserve memory samples CSV"}]

    @web_ui.app.route("/forkserve/memory.csv")
    def forkserve_memory_csv():
        with open(sampler.csv_path, "rb") as f:
            body = f.read()
        return Response(body, mimetype="text/csv", headers={
            "Content-Disposition": "attachment; filename=forkserve_memory.csv"})

    @web_ui.app.after_request
    def add_memory(response):
        if request.path != "/stats/requests" or sampler.latest is None:
            return response
        data = response.get_json(silent=True)
        if isinstance(data, dict):
            data["extended_stats"] = [{"key": key, "data": _ui_rows(sampler.latest)}]
            response.set_data(json.dumps(data))
        return response
