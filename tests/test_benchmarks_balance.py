"""benchmarks/balance.py's pure parts: titles, ratios, variants, medians."""

import argparse

import pytest

from benchmarks import balance


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
