"""benchmarks/balance.py's pure parts: titles, ratios, variants, medians."""

import argparse

import pytest

from benchmarks import balance
from benchmarks.harness import procs


def test_the_request_count_comes_from_a_forkserve_worker_title_only():
    assert balance.requests_from_title(
        b"forkserve: worker 2 [balance_app:app] 1203 req, 8.1 MiB private ") == 1203
    assert balance.requests_from_title(b"forkserve: master [balance_app:app] ") is None
    assert balance.requests_from_title(b"/usr/bin/python3 -m gunicorn -w 4 app") is None


def test_busiest_ratio_is_the_largest_over_the_mean():
    assert balance.busiest_ratio([0, 0, 0, 40]) == 4.0
    assert balance.busiest_ratio([10, 10, 10, 10]) == 1.0
    assert balance.busiest_ratio([0, 0]) is None


def test_a_variant_is_a_name_a_tree_and_extra_arguments(tmp_path):
    assert balance.parse_variant(f"race={tmp_path} --no-balance") == (
        "race", str(tmp_path), ["--no-balance"])
    with pytest.raises(argparse.ArgumentTypeError, match="NAME=TREE"):
        balance.parse_variant("just-a-tree")


def test_the_summary_takes_medians_over_rounds_and_the_most_idle_workers():
    rows = [{"connections": 8, "server": "x", "rps": rps, "p99_ms": p99, "responses": 1000,
             "requests": requests, "cpu": cpu}
            for rps, p99, requests, cpu in ((100, 5.0, [1, 1, 1, 1], [1.0, 1.0, 1.0, 1.0]),
                                            (300, 9.0, [0, 0, 2, 2], [0.0, 0.0, 1.0, 1.0]),
                                            (200, 7.0, [1, 1, 1, 5], [1.0, 1.0, 1.0, 1.0]))]
    (summary,) = balance.summarize(rows)
    assert (summary["rounds"], summary["rps"], summary["p99_ms"]) == (3, 200, 7.0)
    assert summary["busiest_requests"] == 2.0  # ratios 1.0, 2.0, 2.5
    assert summary["idle_workers"] == 2
    assert summary["cpu_us"] == 4000  # 4 CPU s over 1000 responses (the median)


def test_a_variant_may_name_its_own_worker_count():
    assert balance.split_workers(["-w", "2", "--no-balance"]) == (2, ["--no-balance"])
    assert balance.split_workers(["--workers=3"]) == (3, [])
    assert balance.split_workers(["--no-balance"]) == (balance.WORKERS, ["--no-balance"])
    with pytest.raises(argparse.ArgumentTypeError, match="give a whole number"):
        balance.split_workers(["-w", "two"])


def test_context_switches_add_the_voluntary_and_involuntary_ones():
    status = ("Name:\tpython\nvoluntary_ctxt_switches:\t120\n"
              "nonvoluntary_ctxt_switches:\t35\n")
    assert procs.switches_from_status(status) == 155


def test_loop_wakes_are_read_from_perf_stat_csv():
    text = ("# started on Thu Nov 26 00:40:00 2026\n\n"
            "91234,,syscalls:sys_enter_epoll_wait,8012345678,100.00,,\n")
    assert balance.perf_count(text) == 91234
    assert balance.perf_count("<not counted>,,syscalls:sys_enter_epoll_wait,0,0.00,,\n") is None


def test_the_summary_gives_switches_and_responses_per_loop_wake():
    rows = [{"connections": 64, "server": "x", "rps": 10, "p99_ms": 1.0, "responses": 1000,
             "requests": [500, 500], "cpu": [1.0, 1.0], "switches": 600, "wakes": wakes}
            for wakes in (50, 100, None)]
    (summary,) = balance.summarize(rows)
    assert summary["switches_per_response"] == 0.6
    assert summary["responses_per_wake"] == 15.0  # 20 and 10; the run without perf is left out


def test_schedstat_gives_time_on_a_cpu_time_waiting_and_turns():
    assert procs.schedstat_fields("2400000 5100000 31\n") == (2400000, 5100000, 31)


def test_the_summary_gives_the_workers_turn_on_a_cpu_and_their_runnable_wait():
    rows = [{"connections": 64, "server": "x", "rps": 10, "p99_ms": 1.0, "responses": 1000,
             "requests": [500, 500], "cpu": [1.0, 1.0], "switches": 600, "wakes": None,
             "schedstat": schedstat}
            for schedstat in ([75_000_000, 140_000_000, 1000], [85_000_000, 160_000_000, 1000])]
    (summary,) = balance.summarize(rows)
    assert summary["turn_us"] == 80.0          # 75 and 85 µs a turn
    assert summary["wait_us_per_response"] == 150.0  # 140 and 160 µs over 1000 responses
