"""The reporter on a live server: figures, endpoints, and recycling on USS."""

import json
import re
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

from forkserve_testing import poll

pytestmark = pytest.mark.e2e

STATS = re.compile(r"Stats at: http://127\.0\.0\.1:(\d+)")
FIELDS = {"Rss": "rss", "Pss": "pss", "Private_Clean": "private_clean",
          "Private_Dirty": "private_dirty", "Shared_Clean": "shared_clean"}


def _independent_reading(pid):
    """Read smaps_rollup without forkserve's parser."""
    values = {}
    with open(f"/proc/{pid}/smaps_rollup") as handle:
        for line in handle:
            name, _, rest = line.partition(":")
            if name in FIELDS:
                values[FIELDS[name]] = int(rest.split()[0]) * 1024
    return values


def _stats_port(server):
    return int(poll(lambda: STATS.search(server.log()), message="the stats line").group(1))


def _fetch(port, path):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
        return response.status, response.headers.get("Content-Type"), response.read().decode()


def test_memory_json_agrees_with_an_independent_reading_of_proc(run_server, tmp_path):
    pidfile = tmp_path / "server.pid"
    server = run_server("-w", "2", "--pid", str(pidfile), app="hog:app")
    workers = server.wait_workers(2)
    out = subprocess.run([sys.executable, "-m", "forkserve", "memory", "--pid", str(pidfile),
                          "--json"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    rows = {row["pid"]: row for row in report["processes"]}
    assert set(rows) == {server.pid, *workers}
    assert rows[server.pid]["role"] == "master"
    for pid, row in rows.items():
        truth = _independent_reading(pid)
        # PSS divides each page among the processes mapping it at that moment
        # (the `forkserve memory` process maps libpython too), so it cannot
        # be reread later; the other figures belong to the process alone.
        # A few library pages also move between "shared" and "private" when
        # another process maps or unmaps them: allow 256 KiB for those.
        truth["uss"] = truth["private_clean"] + truth["private_dirty"]
        for key in ("rss", "uss", "shared_clean"):
            value = truth[key]
            assert abs(row[key] - value) <= 0.02 * value + 256 * 1024, (pid, key, row[key],
                                                                        value)
        assert row["uss"] <= row["pss"] <= row["rss"]
    totals = report["totals"]
    assert totals["pss"] == sum(row["pss"] for row in report["processes"])
    assert totals["master_rss"] == rows[server.pid]["rss"]
    assert totals["cost_ratio"] == pytest.approx(totals["pss"] / totals["master_rss"])

    table = subprocess.run([sys.executable, "-m", "forkserve", "memory", "--pid", str(pidfile)],
                           capture_output=True, text=True, timeout=30)
    assert table.returncode == 0 and "master" in table.stdout and "MiB" in table.stdout


def test_stats_endpoint_serves_json_and_prometheus_text(run_server):
    server = run_server("-w", "2", "--stats", "127.0.0.1:0", app="hog:app")
    workers = server.wait_workers(2)
    for _ in range(6):
        server.get("/")
    port = _stats_port(server)
    status, content_type, body = _fetch(port, "/")
    assert status == 200 and content_type == "application/json"
    report = json.loads(body)
    rows = {row["pid"]: row for row in report["processes"]}
    assert set(rows) == {server.pid, *workers}
    served = sum(rows[pid]["requests"] for pid in workers)
    assert served >= 6
    assert sorted(rows[pid]["worker_id"] for pid in workers) == [1, 2]

    status, content_type, text = _fetch(port, "/metrics")
    assert status == 200 and content_type.startswith("text/plain; version=0.0.4")
    _check_prometheus(text)
    assert f'forkserve_process_uss_bytes{{pid="{server.pid}",role="master"}}' in text

    out = subprocess.run([sys.executable, "-m", "forkserve", "memory", "--stats",
                          f"127.0.0.1:{port}", "--json"], capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 0, out.stderr
    assert {row["pid"] for row in json.loads(out.stdout)["processes"]} == set(rows)


def _check_prometheus(text):
    sample = re.compile(r'^[a-zA-Z_:][a-zA-Z0-9_:]*(\{[a-zA-Z_][a-zA-Z0-9_]*="[^"]*"'
                        r'(,[a-zA-Z_][a-zA-Z0-9_]*="[^"]*")*\})? -?[0-9.e+-]+$')
    typed, seen = set(), set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            typed.add(line.split()[2])
        elif line and not line.startswith("#"):
            assert sample.match(line), line
            name = re.split(r"[{ ]", line, maxsplit=1)[0]
            assert name in typed or name.rsplit("_", 1)[0] in typed, line
            series = line.rsplit(" ", 1)[0]
            assert series not in seen, f"duplicate series {series}"
            seen.add(series)
    assert seen


def test_stats_are_outside_the_application_url_space(run_server):
    server = run_server("-w", "1", "--stats", "127.0.0.1:0", app="basic:app")
    server.wait_workers(1)
    assert server.get("/metrics")[0] == 404  # the app's own 404
    assert _fetch(_stats_port(server), "/metrics")[0] == 200


def test_memory_log_interval_logs_every_process(run_server):
    server = run_server("-w", "2", "--memory-log-interval", "0.5", app="hog:app")
    server.wait_workers(2)
    poll(lambda: server.log().count("Memory of worker") >= 2 and "Memory: " in server.log(),
         message="memory log lines")


def test_single_process_stats_endpoint(run_server):
    server = run_server("-w", "0", "--stats", "127.0.0.1:0", app="hog:app")
    report = json.loads(_fetch(_stats_port(server), "/")[2])
    assert [row["role"] for row in report["processes"]] == ["single"]


def test_worker_over_max_worker_memory_is_replaced_without_errors(run_server):
    server = run_server("-w", "2", "--max-worker-memory", "40", app="hog:app")
    server.wait_workers(2)
    errors, statuses, stop = [], [], threading.Event()

    def load():
        deadline = time.monotonic() + 60
        while not stop.is_set() and time.monotonic() < deadline:
            try:
                statuses.append(server.get("/")[0])
            except OSError as exc:
                errors.append(exc)

    client = threading.Thread(target=load)
    client.start()
    try:
        hog = int(server.get("/alloc?60")[1])
        poll(lambda: hog not in server.children() and len(server.children()) == 2,
             timeout=20, message="the hog worker to be recycled")
        for _ in range(20):
            statuses.append(server.get("/")[0])
    finally:
        stop.set()
        client.join(10)
    assert errors == []
    assert statuses and set(statuses) == {200}
    assert "over --max-worker-memory 40 MiB" in server.log()


def test_worker_titles_show_requests_and_private_memory(run_server):
    server = run_server("-w", "1", "-n", "persondb", app="hog:app")
    [worker] = server.wait_workers(1)

    def title(pid):
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read().replace(b"\0", b" ").decode().strip()

    def served():
        match = re.fullmatch(r"persondb: worker 1 \[hog:app\] (\d+) req, [\d.]+ MiB private",
                             title(worker))
        return match and int(match.group(1))

    assert title(server.pid) == "persondb: master [hog:app]"
    poll(lambda: served() is not None, message=f"the worker title, now {title(worker)!r}")
    before = served()
    for _ in range(5):
        assert server.get("/")[0] == 200
    poll(lambda: (served() or 0) >= before + 5, message=f"the title to count, now {title(worker)!r}")
