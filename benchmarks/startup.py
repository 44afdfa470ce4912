"""Start and reload cost of forkserve on the PersonDB dataset, per data mode.

    python benchmarks/startup.py                  # 300,000 people, -w 16, dict/share/store
    python benchmarks/startup.py --quick          # 20,000 people, -w 4
    python benchmarks/startup.py --modes store --rows 100000
    python3.12 -m venv .venv312 && .venv312/bin/pip install -e '.[bench]'
    python benchmarks/startup.py --python .venv312/bin/python   # share needs 3.12+

For each mode (PERSONDB_MODE dict, share, store; share needs Python 3.12+)
it starts ``python -m forkserve -w N examples.persondb.app:app`` pinned to
--server-cpus and records, on the harness's monotonic clock:

- start -> listening: from spawning the process to its "Listening at" log
  line: interpreter start, imports and loading the dataset (the master
  listens only once the app is loaded);
- start -> first answer: to the first 200 from GET /health (sent as soon as
  the server listens; it waits in the listen backlog until a worker
  accepts);
- fork: from "Listening at" to the first and to the N-th "Booting worker"
  log line (each worker logs it once its server accepts): forking N
  workers, with what the master does first (preloading the worker modules,
  freezing the heap);
- HUP -> new generation answers: from SIGHUP to the master until a GET
  /health (a new connection each time, every few ms) is answered by a pid
  that was not a worker before the HUP (the app's /health returns its pid);
- HUP -> old workers gone: until none of the old workers is alive (they
  drain once the new generation is ready, then exit).

A thread tails the log every LOG_POLL_S, so log-line times are when the
harness saw the line (at most a few ms late), not the log's own
second-resolution timestamps. One run per mode; the machine's load is
recorded with the results (startup.md, startup.csv in --out).
"""

import argparse
import csv
import datetime
import http.client
import json
import os
import re
import shlex
import signal
import sys
import tempfile
import threading
import time

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.harness import procs  # noqa: E402
from benchmarks.harness.datasets import build_store, prepare_dataset  # noqa: E402
from benchmarks.harness.machine import Conditions, machine, say, stop_on_signals  # noqa: E402
from benchmarks.harness.results import Result, command_line  # noqa: E402
from benchmarks.harness.servers import APP, REPO, python_version  # noqa: E402

#: the figures benchmarks/README.md shows of a run's rows (benchmarks.harness.index)
RESULT_COLUMNS = (
    ("mode", "mode"), ("master_rss_mib", "master RSS (MiB)"), ("listening_s", "start → listening"),
    ("first_answer_s", "start → first answer"), ("fork_first_s", "fork: 1st worker"),
    ("fork_all_s", "fork: all workers"), ("hup_new_answer_s", "HUP → new generation answers"),
    ("hup_old_gone_s", "HUP → old workers gone"), ("note", "note"),
)

MODES = ("dict", "share", "store")
LOG_POLL_S = 0.002
PROBE_INTERVAL_S = 0.005
TIMEOUT_S = 300.0

_LISTENING = re.compile(rb"Listening at: http://127\.0\.0\.1:(\d+)")
_BOOTED = re.compile(rb"Booting worker \d+ with pid: (\d+)")

FIELDS = ("mode", "rows", "workers", "listening_s", "first_answer_s", "fork_first_s",
          "fork_all_s", "hup_new_answer_s", "hup_old_gone_s", "master_rss_mib", "note")


class LogWatcher(threading.Thread):
    """Tails a log file; records when each listening / booting line appears."""

    def __init__(self, path):
        super().__init__(name="log-watcher", daemon=True)
        self.path = path
        self.port = None
        self.listening_at = None
        #: [(monotonic time seen, pid)] of "Booting worker" lines, in order
        self.booted = []
        self._finished = threading.Event()

    def run(self):
        offset, pending = 0, b""
        while not self._finished.is_set():
            with open(self.path, "rb") as f:
                f.seek(offset)
                chunk = f.read()
            now = time.monotonic()
            offset += len(chunk)
            lines = (pending + chunk).split(b"\n")
            pending = lines.pop()
            for line in lines:
                self._see(line, now)
            self._finished.wait(LOG_POLL_S)

    def _see(self, line, now):
        match = _LISTENING.search(line)
        if match and self.port is None:
            self.port, self.listening_at = int(match.group(1)), now
        match = _BOOTED.search(line)
        if match:
            self.booted.append((now, int(match.group(1))))

    def stop(self):
        self._finished.set()
        self.join()


def health_pid(port, timeout):
    """The pid in /health's answer on a new connection, or None."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", "/health")
        response = conn.getresponse()
        body = response.read()
        return json.loads(body)["pid"] if response.status == 200 else None
    except (OSError, http.client.HTTPException, ValueError, KeyError):
        return None
    finally:
        conn.close()


def wait_for(condition, deadline, what, group):
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        if not group.alive():
            raise RuntimeError(f"the server exited while waiting for {what}")
        time.sleep(LOG_POLL_S)


def measure(mode, args, csv_path, env, log_dir):
    """One mode's row of FIELDS."""
    row = {"mode": mode, "rows": args.rows, "workers": args.workers, "note": ""}
    log_path = os.path.join(log_dir, f"startup-{mode}.log")
    open(log_path, "wb").close()
    argv = (["taskset", "-c", args.server_cpus] if args.server_cpus else []) + [
            args.python, "-m", "forkserve",
            "-w", str(args.workers), "-b", "127.0.0.1:0", "--graceful-timeout", "10", APP]
    with open(log_path, "ab") as log:
        log.write(f"$ {shlex.join(argv)}\n".encode())
    watcher = LogWatcher(log_path)
    server_env = dict(env, PERSONDB_CSV=csv_path, PERSONDB_MODE=mode,
                      PERSONDB_STORE=csv_path + ".store")
    started = time.monotonic()
    deadline = started + TIMEOUT_S
    with procs.Group(argv, log_path=log_path, env=server_env, cwd=REPO) as group:
        watcher.start()
        try:
            wait_for(lambda: watcher.port is not None, deadline, "'Listening at'", group)
            row["listening_s"] = watcher.listening_at - started
            master_rss = procs.rss(group.pid)
            row["master_rss_mib"] = master_rss and round(master_rss / 2**20)
            wait_for(lambda: health_pid(watcher.port, 10) is not None, deadline,
                     "a first answer", group)
            row["first_answer_s"] = time.monotonic() - started
            wait_for(lambda: len(watcher.booted) >= args.workers, deadline,
                     f"{args.workers} 'Booting worker' lines", group)
            row["fork_first_s"] = watcher.booted[0][0] - watcher.listening_at
            row["fork_all_s"] = watcher.booted[args.workers - 1][0] - watcher.listening_at
            old = {pid for _, pid in watcher.booted}
            hup = time.monotonic()
            group.popen.send_signal(signal.SIGHUP)
            wait_for(lambda: health_pid(watcher.port, 10) not in old | {None},
                     hup + TIMEOUT_S, "an answer from the new generation", group)
            row["hup_new_answer_s"] = time.monotonic() - hup
            wait_for(lambda: not any(procs.alive(pid) for pid in old), hup + TIMEOUT_S,
                     "the old workers to exit", group)
            row["hup_old_gone_s"] = time.monotonic() - hup
        except (TimeoutError, RuntimeError) as exc:
            row["note"] = f"{exc} (see logs/startup-{mode}.log)"
        finally:
            watcher.stop()
    return row


def render(rows, meta):
    out = [f"# forkserve start and reload cost: {meta['title']}\n"]
    out += [f"- **{key}**: {value}" for key, value in meta.items() if key != "title"]
    out += ["", "Seconds on the harness's clock; definitions in benchmarks/startup.py.\n",
            "| mode | master RSS | start → listening | start → first answer | "
            "fork: 1st worker | fork: all workers | HUP → new generation answers | "
            "HUP → old workers gone | note |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---|"]

    def cell(value, fmt="{:.2f}"):
        return "—" if value is None else fmt.format(value)

    for r in rows:
        out.append(f"| {r['mode']} | {cell(r.get('master_rss_mib'), '{:,} MiB')} | "
                   f"{cell(r.get('listening_s'))} | {cell(r.get('first_answer_s'))} | "
                   f"{cell(r.get('fork_first_s'), '{:.3f}')} | "
                   f"{cell(r.get('fork_all_s'), '{:.3f}')} | "
                   f"{cell(r.get('hup_new_answer_s'))} | {cell(r.get('hup_old_gone_s'))} | "
                   f"{r.get('note', '')} |")
    return "\n".join(out) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(prog="python benchmarks/startup.py",
                                description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="20,000 people and 4 workers")
    p.add_argument("--rows", type=int, help="dataset rows (300,000; --quick 20,000)")
    p.add_argument("--workers", type=int, help="workers (16; --quick 4)")
    p.add_argument("--modes", default=",".join(MODES), help="comma-separated: dict,share,store")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--python", default=sys.executable, help="the server's interpreter")
    p.add_argument("--server-cpus", default="0",
                   help="taskset CPUs for the server (0; '' leaves it unpinned)")
    p.add_argument("--data-dir", default=os.path.join(tempfile.gettempdir(), "forkserve-bench"))
    p.add_argument("--out", help="results directory (default benchmarks/results/startup, "
                                 "or a temp dir with --quick)")
    args = p.parse_args(argv)
    args.rows = args.rows or (20_000 if args.quick else 300_000)
    args.workers = args.workers or (4 if args.quick else 16)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = sorted(set(modes) - set(MODES))
    if unknown:
        p.error(f"unknown mode(s) {', '.join(unknown)}; choose from {', '.join(MODES)}")
    out = args.out or (os.path.join(tempfile.gettempdir(), "forkserve-startup-quick")
                       if args.quick else os.path.join(REPO, "benchmarks", "results", "startup"))
    os.makedirs(os.path.join(out, "logs"), exist_ok=True)
    env = dict(os.environ, PYTHONPATH=REPO, PYTHONUNBUFFERED="1")
    conditions = Conditions()
    started_at = datetime.datetime.now(datetime.timezone.utc)
    version = python_version(args.python)
    rows = []
    with stop_on_signals():
        csv_path, _ = prepare_dataset(args.rows, args.seed, args.data_dir)
        for mode in modes:
            if mode == "share" and version < (3, 12):
                rows.append({"mode": mode, "note": "needs Python 3.12+ (--python)"})
                continue
            if mode == "store":
                _, problem = build_store(args.python, csv_path, env)
                if problem:
                    rows.append({"mode": mode, "note": f"building the Store failed: {problem}"})
                    continue
            say(f"{mode}: starting {args.workers} workers on {args.rows:,} rows")
            rows.append(measure(mode, args, csv_path, env, os.path.join(out, "logs")))
            say(f"{mode}: {rows[-1]}")
    command = command_line("startup.py", argv)
    meta = {
        "title": f"{args.rows:,} people, -w {args.workers}" + (" (--quick)" if args.quick else ""),
        "date": started_at.strftime("%Y-%m-%d %H:%M UTC"),
        "command": f"`{command}`",
        "machine": f"{machine()}; {conditions.describe()}",
        "python": ".".join(map(str, version)),
        "server": f"pinned to CPU {args.server_cpus}" if args.server_cpus else "not pinned",
    }
    Result.measured("startup.py", command, rows, conditions, title=meta["title"],
                    date=meta["date"], versions={"python": meta["python"]}).write(out)
    page = render(rows, meta)
    with open(os.path.join(out, "startup.md"), "w") as f:
        f.write(page)
    with open(os.path.join(out, "startup.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS, restval="", lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    print(page)
    return 0 if any(not r.get("note") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
