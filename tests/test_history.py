"""The memory history behind the stats dashboard, and the routes serving it.

Pure: made-up reports, no processes (the browser test is test_dashboard_e2e.py).
"""

import json
import re

import pytest

from forkserve.http import dashboard, stats
from forkserve.memory import render
from forkserve.memory.history import History
from forkserve.memory.model import ProcessInfo, ProcessRow, Report
from forkserve.memory.procfs import ProcessMemory

MIB = 1024 * 1024


def _memory(pid, private, pss):
    return ProcessMemory(pid=pid, rss=pss + 10 * MIB, pss=pss, shared_clean=10 * MIB,
                         shared_dirty=0, private_clean=0, private_dirty=private, swap=0,
                         anonymous=private, pss_anon=private, pss_file=0, minor_faults=0,
                         major_faults=0, start_time=0.0)


def _report(time, workers, *, generation=1, master=100, requests=None):
    """A master and workers; workers is {number: pid}; requests {pid: count}."""
    requests = requests or {}
    rows = [ProcessRow(ProcessInfo(master, "master", generation=generation),
                       _memory(master, 20 * MIB, 30 * MIB), 1.0)]
    for number, pid in workers.items():
        info = ProcessInfo(pid, "worker", number, requests=requests.get(pid, 0),
                           generation=generation)
        rows.append(ProcessRow(info, _memory(pid, 2 * MIB, 12 * MIB), 1.0))
    return Report(tuple(rows), time)


def test_each_point_holds_each_processes_private_memory_and_the_rest_of_its_pss():
    history = History()
    history.add(_report(1000.0, {1: 201, 2: 202}))
    [point] = history.to_json()["points"]
    assert point["values"] == {"master": [20 * MIB, 10 * MIB], "worker 1": [2 * MIB, 10 * MIB],
                               "worker 2": [2 * MIB, 10 * MIB]}
    assert history.to_json()["series"]["worker 2"] == {"role": "worker", "worker": 2,
                                                       "generation": 1}


def test_the_history_says_what_the_newest_sample_costs_as_forkserve_memory_does():
    history = History()
    assert history.to_json()["headline"] is None
    history.add(_report(1000.0, {1: 201}))
    newest = _report(1001.0, {1: 201, 2: 202})
    history.add(newest)
    assert history.to_json(since=1001.0)["headline"] == render.headline(newest) == (
        "3 processes use 54.0 MiB: 50.0 MiB for one copy of the application, "
        "2.0 MiB more for each of 2 workers")


def test_a_generations_processes_keep_their_series_from_starting_to_draining():
    memory = _memory(1, 2 * MIB, 12 * MIB)

    def supervised(time, state, *, draining_worker=None):
        infos = [ProcessInfo(1, "supervisor"), ProcessInfo(30, "master", generation=3,
                                                          state=state),
                 ProcessInfo(31, "worker", 1, generation=3, state=state)]
        if draining_worker:  # a recycled worker still draining beside worker 1
            infos.append(ProcessInfo(draining_worker, "worker", 1, generation=3,
                                     state="draining"))
        return Report(tuple(ProcessRow(info, memory, 1.0) for info in infos), time)
    history = History()
    history.add(supervised(1000.0, "starting"))
    history.add(supervised(1001.0, "serving", draining_worker=29))
    history.add(supervised(1002.0, "draining"))
    labels = [set(point["values"]) for point in history.to_json()["points"]]
    assert labels == [{"supervisor", "master g3", "worker 1 g3"},
                      {"supervisor", "master g3", "worker 1 g3", "worker 1 g3 draining"},
                      {"supervisor", "master g3", "worker 1 g3"}]


def test_request_rate_counts_a_recycled_workers_replacement_from_zero_not_negative():
    history = History()
    history.add(_report(1000.0, {1: 201, 2: 202}, requests={201: 50, 202: 40}))
    history.add(_report(1002.0, {1: 301, 2: 202}, requests={301: 6, 202: 44}))
    first, second = history.to_json()["points"]
    assert first["rate"] is None  # nothing to compare with yet
    assert second["rate"] == pytest.approx((6 + 4) / 2)


def test_a_recycle_and_a_new_generation_are_markers_the_first_generation_and_its_workers_not():
    history = History()
    history.add(_report(1000.0, {1: 201, 2: 202}))
    history.add(_report(1001.0, {1: 301, 2: 202}))
    history.add(_report(1002.0, {1: 401, 2: 402}, generation=2, master=400))
    events = history.to_json()["events"]
    assert [(e["t"], e["kind"]) for e in events] == [(1001.0, "recycle"), (1002.0, "generation")]
    assert events[0]["text"] == "worker 1: pid 201 replaced by 301"
    assert events[1]["text"] == "generation 2 started"


def test_points_beyond_the_window_are_averaged_per_step_and_the_history_stays_bounded():
    history = History(window=10.0, step=5.0, coarse_window=20.0)
    for second in range(100):
        history.add(_report(1000.0 + second, {1: 201}))
    points = history.to_json()["points"]
    fine = [p for p in points if p["t"] >= 1099.0 - 10.0]
    coarse = [p for p in points if p["t"] < 1099.0 - 10.0]
    assert len(fine) == 11  # one a second over the window
    assert 1 <= len(coarse) <= 20 / 5 + 2  # one a step over coarse_window, and the open one
    assert all(b["t"] > a["t"] for a, b in zip(points, points[1:]))
    assert coarse[-1]["values"]["worker 1"] == [2 * MIB, 10 * MIB]  # the mean of equal values


def test_a_downsampled_point_is_the_mean_of_its_samples():
    history = History(window=1.0, step=10.0)
    for second, private in enumerate((2, 4, 6)):
        report = _report(1000.0 + second, {})
        row = report.processes[0]
        memory = _memory(100, private * MIB, 30 * MIB)
        history.add(Report((ProcessRow(row.info, memory, 1.0),), report.time))
    history.add(_report(1020.0, {}))
    bucket = history.to_json()["points"][0]
    assert bucket["t"] == pytest.approx(1001.0)
    assert bucket["values"]["master"][0] == 4 * MIB


def test_series_whose_points_have_all_expired_are_forgotten():
    history = History(window=2.0, step=1.0, coarse_window=2.0)
    history.add(_report(1000.0, {1: 201, 2: 202}))
    for second in range(1, 10):
        history.add(_report(1000.0 + second, {1: 201}))
    assert set(history.to_json()["series"]) == {"master", "worker 1"}


def test_since_gives_only_newer_points_and_events():
    history = History()
    history.add(_report(1000.0, {1: 201}))
    history.add(_report(1001.0, {1: 301}))
    newer = history.to_json(since=1000.0)
    assert [p["t"] for p in newer["points"]] == [1001.0]
    assert [e["t"] for e in newer["events"]] == [1001.0]
    assert history.to_json(since=1001.0)["points"] == []


def test_the_next_sample_waits_fifty_times_what_the_last_one_cost_and_at_least_a_second():
    history = History()
    assert history.due(0.0)
    history.sampled(10.0, 0.004)  # 4 ms: a small server
    assert history.interval == 1.0 and not history.due(10.9) and history.due(11.0)
    history.sampled(20.0, 0.2)  # 200 ms: 16 workers mapping 1 GiB each
    assert history.interval == pytest.approx(10.0) and not history.due(29.9)


def test_a_client_asking_for_fresh_figures_gets_a_sample_sooner_within_its_own_budget():
    history = History()
    history.sampled(10.0, 0.03)  # paced: every 1.5 s
    assert not history.due(11.2) and not history.due(11.2, max_age=2.0)
    assert history.due(11.2, max_age=1.0)  # 1.2 s old: older than asked
    assert not history.due(10.5, max_age=0.1)  # never more often than once a second
    history.sampled(20.0, 0.2)  # paced: every 10 s; asked for: every 2 s at most
    assert not history.due(21.9, max_age=1.0) and history.due(22.0, max_age=1.0)


def test_a_sample_costs_the_cpu_it_took_not_the_time_spent_waiting_for_a_cpu():
    history, cpu = History(), [5.0]
    wall = iter([100.0, 100.7])  # started, finished

    def make_report():  # 30 ms of CPU, while the machine's load keeps it 0.7 s off a CPU
        cpu[0] += 0.03
        return _report(1000.0, {1: 201})
    stats.sample(history, make_report, clock=lambda: next(wall), cpu_clock=lambda: cpu[0])
    assert history.interval == pytest.approx(1.5) and history.due(101.6)


def test_history_refuses_a_tunable_it_does_not_have():
    with pytest.raises(TypeError, match="no tunable 'windw'"):
        History(windw=60)


def test_sample_reads_a_report_only_when_one_is_due():
    history, reads = History(), []

    def make_report():
        reads.append(1)
        return _report(1000.0 + len(reads), {1: 201})
    times = iter([0.0, 0.5, 1.0])
    for _ in range(3):
        stats.sample(history, make_report, clock=lambda: next(times), cpu_clock=lambda: 0.0)
    assert len(reads) == 2 and len(history.fine) == 2


def _scrape(endpoint, path, make_report):
    """GET `path` from a StatsEndpoint served by this test's select loop."""
    import select
    import socket
    client = socket.create_connection(endpoint.listener.getsockname(), timeout=5)
    with client:
        client.sendall(f"GET {path} HTTP/1.1\r\nHost: s\r\n\r\n".encode())
        received = b""
        for _ in range(1000):  # a turn of the loop each, until the endpoint closes
            readable, writable, _ = select.select(endpoint.filenos(),
                                                  endpoint.writable_filenos(), [], 0.05)
            endpoint.service(readable, writable, make_report)
            if select.select([client], [], [], 0)[0]:
                data = client.recv(65536)
                if not data:
                    return received
                received += data
    raise AssertionError(f"no complete answer from the stats endpoint: {received!r}")


def test_stats_endpoint_answers_scrapes_from_the_latest_sample_until_the_next_is_due():
    import socket
    reads, now = [], [0.0]

    def make_report():  # a report makes the kernel walk every process's pages: count them
        reads.append(now[0])
        return _report(1000.0 + len(reads), {1: 201})

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    endpoint = stats.StatsEndpoint(listener, clock=lambda: now[0])
    with listener:
        for path in ("/json", "/metrics", "/json"):
            assert _scrape(endpoint, path, make_report).startswith(b"HTTP/1.1 200 ")
        assert reads == [0.0]  # the first turn's sample, served to every scrape
        assert json.loads(_scrape(endpoint, "/json", make_report).split(b"\r\n\r\n", 1)[1]
                          )["time"] == 1001.0
        now[0] = endpoint.history.next_due  # the next sample is due
        body = _scrape(endpoint, "/json", make_report).split(b"\r\n\r\n", 1)[1]
        assert reads == [0.0, now[0]] and json.loads(body)["time"] == 1002.0


# -- the routes ---------------------------------------------------------------


def _no_report(max_age=None):
    raise AssertionError("the dashboard page must not read /proc")


def test_root_serves_the_dashboard_page_and_json_to_clients_that_ask_only_for_json():
    status, content_type, body = stats.respond("GET", "/", _no_report)
    assert (status, content_type) == ("200 OK", "text/html; charset=utf-8")
    assert body.startswith(b"<!DOCTYPE html>") and b"history" in body
    for accept in ("application/json", "application/json; q=1.0, */*;q=0.1"):
        status, content_type, body = stats.respond("GET", "/", lambda max_age: _report(5.0, {}),
                                                   accept=accept)
        assert content_type == "application/json" and json.loads(body)["time"] == 5.0
    browser = "text/html,application/xhtml+xml,application/json;q=0.9,*/*;q=0.8"
    assert stats.respond("GET", "/", _no_report, accept=browser)[1].startswith("text/html")
    assert json.loads(stats.respond("GET", "/json", lambda max_age: _report(6.0, {}))[2])["time"] == 6.0


def test_history_route_serves_the_history_and_explains_a_bad_since():
    history = History()
    history.add(_report(1000.0, {1: 201}))
    history.add(_report(1001.0, {1: 201}))
    status, content_type, body = stats.respond("GET", "/history?since=1000", _no_report,
                                               history=history)
    assert (status, content_type) == ("200 OK", "application/json")
    assert [p["t"] for p in json.loads(body)["points"]] == [1001.0]
    status, _, body = stats.respond("GET", "/history?since=yesterday", _no_report,
                                    history=history)
    assert status == "400 Bad Request" and b"epoch seconds" in body


def test_the_dashboard_loads_nothing_from_elsewhere():
    page = dashboard.page().decode()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page, re.IGNORECASE)
    assert "@import" not in page and not re.search(r"url\(\s*['\"]?(https?:)?//", page)
    assert re.search(r"fetch\(\"history\"", page)  # relative: works behind a path prefix


def test_a_dumped_history_loads_back_with_its_points_buckets_events_and_series():
    history = History(window=5.0, step=4.0)
    for second in range(12):  # some points folded into buckets, one bucket still open
        history.add(_report(1000.0 + second, {1: 201 if second < 6 else 301}, requests={
            201: second * 10, 301: second * 10}))
    data = json.loads(json.dumps(history.dump()))  # as it crosses the exec
    loaded = History.load(data, window=5.0, step=4.0)
    assert loaded.to_json() == history.to_json()
    assert loaded.to_json()["events"][0]["text"] == "worker 1: pid 201 replaced by 301"
    loaded.add(_report(1012.0, {1: 301}))  # and it goes on from there
    assert loaded.to_json()["points"][-1]["t"] == 1012.0


@pytest.mark.parametrize("data", [None, [], {"schema": 99}, {"schema": 1, "fine": 3}])
def test_loading_something_that_is_not_a_dumped_history_says_so(data):
    with pytest.raises(ValueError, match="not a forkserve memory history"):
        History.load(data)
