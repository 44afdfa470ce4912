"""The reporter on a live server: figures, endpoints, and recycling on USS."""

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
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
    assert totals["ratio_basis"] == "anonymous"  # Linux >= 5.13 prints Pss_Anon
    assert totals["master_base"] == rows[server.pid]["anonymous"]
    assert totals["total_base"] == sum(row["pss_anon"] for row in report["processes"])
    assert totals["cost_ratio"] == pytest.approx(totals["total_base"] / totals["master_base"])

    table = subprocess.run([sys.executable, "-m", "forkserve", "memory", "--pid", str(pidfile)],
                           capture_output=True, text=True, timeout=30)
    assert table.returncode == 0 and "master" in table.stdout and "MiB" in table.stdout


def test_stats_endpoint_serves_json_and_prometheus_text(run_server):
    server = run_server("-w", "2", "--stats", "127.0.0.1:0", app="hog:app")
    workers = server.wait_workers(2)
    for _ in range(6):
        server.get("/")
    port = _stats_port(server)

    def sampled_after_the_requests():  # /json is the latest sample, up to a second old
        status, content_type, body = _fetch(port, "/json")
        assert status == 200 and content_type == "application/json"
        rows = {row["pid"]: row for row in json.loads(body)["processes"]}
        assert set(rows) == {server.pid, *workers}
        return rows if sum(rows[pid]["requests"] for pid in workers) >= 6 else None
    rows = poll(sampled_after_the_requests, message="a sample counting the 6 requests")
    assert sorted(rows[pid]["worker_id"] for pid in workers) == [1, 2]

    status, content_type, text = _fetch(port, "/metrics")
    assert status == 200 and content_type.startswith("text/plain; version=0.0.4")
    _check_prometheus(text)
    assert 'forkserve_process_uss_bytes{role="master",generation="1"}' in text
    assert f'forkserve_process_info{{role="master",generation="1",pid="{server.pid}",' in text

    out = subprocess.run([sys.executable, "-m", "forkserve", "memory", "--stats",
                          f"127.0.0.1:{port}", "--json"], capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 0, out.stderr
    assert {row["pid"] for row in json.loads(out.stdout)["processes"]} == set(rows)


def test_a_workers_count_in_the_stats_is_every_request_its_app_answered(run_server):
    # A worker stores its count in the scoreboard before its loop next polls,
    # not after each request: once it waits for the next one, the master's
    # figure is the app's own count, exactly.
    server = run_server("-w", "1", "--stats", "127.0.0.1:0", app="hog:app")
    [worker] = server.wait_workers(1)
    for _ in range(6):
        server.get("/")
    seen = int(server.get("/seen")[1])
    port = _stats_port(server)
    counts = []

    def published():
        rows = json.loads(_fetch(port, "/json")[2])["processes"]
        counts.append(next(row["requests"] for row in rows if row["pid"] == worker))
        return counts[-1] == seen

    poll(published, message=f"the stats to count the app's {seen} requests")
    assert all(count <= seen for count in counts), (counts, seen)


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


def _process_series(metrics):
    """The per-process series (name and labels) but the info metric's."""
    return {line.rsplit(" ", 1)[0] for line in metrics.splitlines()
            if line.startswith("forkserve_process_")
            and not line.startswith("forkserve_process_info{")}


def test_prometheus_series_are_the_same_after_a_worker_is_recycled(run_server):
    server = run_server("-w", "2", "--max-requests", "60", "--stats", "127.0.0.1:0",
                        app="basic:app")
    old = set(server.wait_workers(2))
    port = _stats_port(server)
    before = _process_series(_fetch(port, "/metrics")[2])
    assert 'worker="1"' in str(before) and 'worker="2"' in str(before)

    def recycled():
        children = set(server.children())
        if len(children) == 2 and children != old:
            return children
        server.get("/")
        return None
    new = poll(recycled, timeout=60, message="a worker recycled by --max-requests")

    def settled():  # the replaced worker drained and reaped: no draining series
        text = _fetch(port, "/metrics")[2]
        return 'state="draining"' not in text and all(f'pid="{pid}"' in text for pid in new) \
            and text
    metrics = poll(settled, message="the recycle to finish")
    _check_prometheus(metrics)
    assert _process_series(metrics) == before


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
    port = _stats_port(server)
    report = json.loads(_fetch(port, "/json")[2])
    assert [row["role"] for row in report["processes"]] == ["single"]
    for _ in range(3):
        assert server.get("/cycle")[0] == 200
    # The history behind the dashboard is sampled on the process's own event loop.
    def counted():  # a sample before the requests, and one after
        history = json.loads(_fetch(port, "/history")[2])
        return any(point["rate"] for point in history["points"]) and history
    history = poll(counted, message="a sample that counted the requests")
    assert set(history["series"]) == {"single"}
    status, content_type, page = _fetch(port, "/")
    assert content_type.startswith("text/html") and "<svg" in page


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


def _recycled_worker(server, old):
    children = server.children()
    return len(children) == 1 and children != [old] and children


def test_max_worker_memory_counts_copies_not_mapped_file_pages(run_server, tmp_path):
    # A 120 MiB file, written and flushed here: a stand-in for a store file.
    # A worker that reads it all holds 120 MiB of file pages only it maps
    # (Private_Clean, in its USS), which the kernel can drop at any time.
    data = tmp_path / "store.bin"
    with open(data, "wb") as handle:
        for _ in range(120):
            handle.write(os.urandom(1024 * 1024))
        handle.flush()
        os.fsync(handle.fileno())
    server = run_server("-w", "1", "--max-worker-memory", "40", "--memory-log-interval", "0.25",
                        app="hog:app")
    [worker] = server.wait_workers(1)
    assert server.get(f"/map?{data}") == (200, str(worker))
    reading = _independent_reading(worker)
    assert reading["private_clean"] > 100 * 1024 * 1024  # USS alone would be over the limit

    # The master checks every 2 s; its memory log (every 0.25 s, same loop)
    # paces the wait: after 16 more lines, it has checked at least once.
    lines = server.log().count(f"(pid {worker}): ")
    poll(lambda: server.log().count(f"(pid {worker}): ") >= lines + 16, timeout=30,
         message="the master to log the mapped worker's memory 16 more times")
    assert server.children() == [worker]
    assert "over --max-worker-memory" not in server.log()
    assert re.search(rf"worker 1 \(pid {worker}\): .* private [\d.]+ (KiB|MiB), "
                     r"file 1[2-9]\d\.\d MiB", server.log())

    assert server.get("/alloc?60") == (200, str(worker))  # 60 MiB of anonymous copies
    poll(lambda: _recycled_worker(server, worker), timeout=20,
         message="the worker that copied 60 MiB to be recycled")
    recycled = re.search(r"has ([\d.]+) MiB private memory, over --max-worker-memory 40 MiB",
                         server.log())
    assert recycled and 60 <= float(recycled.group(1)) < 100, server.log()


def _memory_json(*where):
    out = subprocess.run([sys.executable, "-m", "forkserve", "memory", *where, "--json"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def _tree(report):
    return [(row["pid"], row["role"], row["generation"], row["state"])
            for row in report["processes"]]


def _children(pid):
    with open(f"/proc/{pid}/task/{pid}/children") as handle:
        return sorted(int(child) for child in handle.read().split())


def _title(pid):
    with open(f"/proc/{pid}/cmdline", "rb") as handle:
        return handle.read().replace(b"\0", b" ").decode().strip()


def _generation_masters(supervisor):
    return [pid for pid in _children(supervisor) if _title(pid).split(": ", 1)[1].startswith(
        ("generation", "master"))]


def _reload_while_a_request_is_held(server, release, new_generation):
    """HUP with a request in flight; return (new master, its workers) once
    the new generation serves and the old one is still draining."""
    held = threading.Thread(target=server.get, args=(f"/hold?{release}",),
                            kwargs={"timeout": 60})
    held.start()
    poll(lambda: os.path.exists(f"{release}.held"), message="the held request to arrive")
    before = set(_children(server.pid))
    server.signal(signal.SIGHUP)
    poll(lambda: re.search(rf"Generation {new_generation} serves", server.log()),
         timeout=30, message=f"generation {new_generation} to serve")
    [new_master] = set(_children(server.pid)) - before
    workers = poll(lambda: len(_children(new_master)) == 2 and _children(new_master),
                   timeout=30, message=f"generation {new_generation}'s workers")
    return held, new_master, workers


def _stats_tree_becomes(stats, tree, rows=None):
    """The stats endpoint's report once its tree (its first `rows` rows) is
    `tree`: it answers with its latest sample, taken at most a sampling
    interval after the change (forkserve.http.stats)."""
    return poll(lambda: (lambda report: _tree(report)[:rows] == tree and report)(
        _memory_json(*stats)), timeout=30, message=f"the stats endpoint's report to show {tree}")


def test_memory_after_reloads_shows_supervisor_generations_and_their_workers(
        run_server, tmp_path):
    pidfile = tmp_path / "server.pid"
    server = run_server("-w", "2", "--pid", str(pidfile), "--stats", "127.0.0.1:0",
                        app="hog:app")
    first_workers = server.wait_workers(2)
    stats = ("--stats", f"127.0.0.1:{_stats_port(server)}")

    # The first HUP: the master drains its own workers under generation 2.
    held, g2_master, g2_workers = _reload_while_a_request_is_held(
        server, tmp_path / "release1", 2)
    try:
        tree = _tree(_memory_json("--pid", str(pidfile)))
        assert tree[:4] == [(g2_master, "master", 2, "serving"),
                            (g2_workers[0], "worker", 2, "serving"),
                            (g2_workers[1], "worker", 2, "serving"),
                            (server.pid, "master", 1, "draining")]
        assert {row[0] for row in tree[4:]} <= set(first_workers)
        assert {row[1:] for row in tree[4:]} == {("worker", 1, "draining")}
        _stats_tree_becomes(stats, tree[:4], 4)
    finally:
        (tmp_path / "release1").touch()
        held.join(60)
    poll(lambda: "continues as its supervisor" in server.log(), timeout=30,
         message="the master to become the supervisor")
    # The line is logged before the exec: wait for the supervisor to title itself.
    title = poll(lambda: "supervisor" in _title(server.pid) and _title(server.pid),
                 message="the supervisor's process title")
    assert "master" not in title

    # The second HUP: the supervisor serves generation 3, generation 2 drains.
    held, g3_master, g3_workers = _reload_while_a_request_is_held(
        server, tmp_path / "release2", 3)
    try:
        assert "serving generation 3" in _title(server.pid)
        tree = _tree(_memory_json("--pid", str(pidfile)))
        assert tree[:5] == [(server.pid, "supervisor", None, None),
                            (g3_master, "master", 3, "serving"),
                            (g3_workers[0], "worker", 3, "serving"),
                            (g3_workers[1], "worker", 3, "serving"),
                            (g2_master, "master", 2, "draining")]
        assert {row[0] for row in tree[5:]} <= set(g2_workers)
        assert {row[1:] for row in tree[5:]} == {("worker", 2, "draining")}
        _stats_tree_becomes(stats, tree)
    finally:
        (tmp_path / "release2").touch()
        held.join(60)
    poll(lambda: g2_master not in _children(server.pid), timeout=30,
         message="generation 2 to finish draining")

    expected = [(server.pid, "supervisor", None, None), (g3_master, "master", 3, "serving"),
                (g3_workers[0], "worker", 3, "serving"), (g3_workers[1], "worker", 3, "serving")]
    for report in (_memory_json("--pid", str(pidfile)), _stats_tree_becomes(stats, expected)):
        assert _tree(report) == expected
        rows = {row["pid"]: row for row in report["processes"]}
        assert report["totals"]["master_rss"] == rows[g3_master]["rss"]
        assert report["totals"]["master_base"] == rows[g3_master]["anonymous"]
        assert report["totals"]["cost_ratio"] == pytest.approx(
            report["totals"]["total_base"] / rows[g3_master]["anonymous"])
    table = subprocess.run([sys.executable, "-m", "forkserve", "memory", "--pid", str(pidfile)],
                           capture_output=True, text=True, timeout=30).stdout
    assert "the master's (g3)" in table and "worker 2 g3" in table
    metrics = _fetch(_stats_port(server), "/metrics")[2]
    assert re.search(rf'forkserve_process_info{{role="worker",worker="\d",generation="3",'
                     rf'pid="{g3_workers[0]}",state="serving"}} 1', metrics)
    # --why asks the worker's own master: generation 3's, under the supervisor.
    why = subprocess.run([sys.executable, "-m", "forkserve", "memory", "--why",
                          str(g3_workers[0]), "--json"], capture_output=True, text=True,
                         timeout=120)
    assert why.returncode == 0, why.stderr
    assert json.loads(why.stdout)["pid"] == g3_workers[0]


@pytest.mark.parametrize("policy, collects", [("young", True), ("off", False)])
def test_worker_gc_policy_collects_and_reports_collections_and_pauses(
        run_server, policy, collects):
    server = run_server("-w", "1", "--worker-gc", policy, "--stats", "127.0.0.1:0",
                        app="hog:app")
    [worker] = server.wait_workers(1)
    assert server.get("/gc")[1].split()[0] == ("700" if collects else "0")
    for _ in range(1000):  # 2 dicts left each: over gen 0's threshold of 700 several times
        assert server.get("/cycle")[0] == 200
    port = _stats_port(server)

    def worker_row():  # the latest sample, up to a history interval old
        [row] = [row for row in json.loads(_fetch(port, "/json")[2])["processes"]
                 if row["pid"] == worker]
        return row
    if collects:
        row = poll(lambda: (row := worker_row())["gc_collections"] and row,
                   message="a sample with the worker's collections")
        assert row["gc_collections"] > 0 and row["gc_pause"] > 0
        metrics = _fetch(port, "/metrics")[2]
        assert re.search(r'forkserve_process_gc_collections_total\{role="worker",worker="1",'
                         r'generation="1"\} [1-9]', metrics)
    else:
        row = worker_row()
        assert (row["gc_collections"], row["gc_pause"]) == (0, 0.0)


@pytest.mark.parametrize("workers", ["2", "0"])
def test_stats_health_is_ready_while_serving_and_not_once_a_stop_begins(run_server, tmp_path,
                                                                       workers):
    server = run_server("-w", workers, "--stats", "127.0.0.1:0", "--graceful-timeout", "20",
                        env={"MARK_DIR": str(tmp_path)})
    port = _stats_port(server)
    if workers != "0":
        server.wait_workers(2)
    assert poll(lambda: _health(port) == 200, message="/health to say ready")
    slow = threading.Thread(target=server.get, args=("/slow?15",), kwargs={"timeout": 30})
    slow.start()
    poll(lambda: any(name.startswith("slow-") for name in os.listdir(tmp_path)),
         message="the slow request to be in flight")
    server.signal(signal.SIGTERM)  # drains the slow request: still up, no longer ready
    assert poll(lambda: _health(port) == 503, message="/health to say not serving")
    slow.join(30)


def _health(port):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as error:
        with error:  # it holds the response open (3.15 warns when it is left unclosed)
            return error.code
