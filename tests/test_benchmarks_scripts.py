"""Every scenario in benchmarks/ runs, on small settings, and prints its table.

One run each, as a user would start it (`python benchmarks/NAME.py
--quick ...`), cut down further to a few seconds: few rows, one round, one
or two servers, no CPU pinning (a CI machine may have one CPU). Each must
exit 0, print its table and, where it writes one, a result.json with rows.
benchmarks/run.py and benchmarks/uwsgi_nginx.py have their own end-to-end
tests (tests/test_benchmarks_quick.py, tests/test_benchmarks_uwsgi.py).
"""

import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from benchmarks.harness import index

ROOT = pathlib.Path(__file__).resolve().parent.parent

#: script: (its options after --quick, a line its table prints, writes result.json)
RUNS = {
    "throughput.py": (["--rows", "500", "--duration", "1", "--warmup", "1",
                       "--servers", "forkserve-w0,hello:forkserve-w4", "--server-cpus", "",
                       "--client-cpus", ""],
                      "| persondb | forkserve-w0 |", True),
    "hello.py": (["--servers", "forkserve-w0", "--duration", "1", "--warmup", "1",
                  "--server-cpus", "", "--client-cpus", ""], "| forkserve-w0 |", True),
    "http_throughput.py": (["--tree", "this=.", "--apps", "hello", "--duration", "1"],
                           "hello     median req/s: this", False),
    "share_heap.py": (["--rows", "2000", "--requests", "2000", "--servers", "forkserve"],
                      "forkserve", False),
    "worker_gc.py": (["--requests", "300", "--policies", "normal"], "| probe | normal |", True),
    "balance.py": (["--connections", "8", "--duration", "1"], "forkserve", False),
    "chaos.py": (["--attacks", "hup", "--servers", "forkserve", "--rows", "2000"],
                 "| hup | forkserve |", True),
    "accesslog.py": (["--rounds", "1", "--seconds", "1"], "median of 1 rounds", True),
    "startup.py": (["--rows", "2000", "--workers", "2", "--modes", "dict",
                    "--server-cpus", ""], "dict", True),
    "shared_store.py": (["--rows", "1000", "--requests", "1000", "--instances", "2"],
                        "| one instance |", True),
    "store_size.py": (["--scale", "0.001"], "| short |", True),
    "http_corpus.py": ([], "valid served right", True),
    "deploy_nginx.py": (["--rows", "1500", "--requests", "1000"], "| 1 |", True),
}

#: scenarios tested elsewhere (see the docstring)
ELSEWHERE = {"run.py", "uwsgi_nginx.py"}


def test_every_scenario_is_run_here_or_elsewhere():
    names = {scenario.name for scenario in index.scenarios()}
    assert names == set(RUNS) | ELSEWHERE
    assert len(names) <= 15, "benchmarks/ keeps at most 15 scenarios (issue 32 item 5)"


def _out_option(script, tmp_path):
    if script in ("http_throughput.py", "chaos.py"):  # no --out: they print only
        return []
    return ["--out", str(tmp_path / "out")]


@pytest.mark.e2e
@pytest.mark.timeout(240)
@pytest.mark.parametrize("script", sorted(RUNS))
def test_a_quick_run_prints_its_table(script, tmp_path):
    if not shutil.which("wrk"):
        pytest.skip("wrk is not installed (apt-get install wrk)")
    if script == "deploy_nginx.py" and not (shutil.which("nginx") or
                                            os.path.exists("/usr/sbin/nginx")):
        pytest.skip("nginx is not installed")
    options, expected, writes_result = RUNS[script]
    if script == "chaos.py":
        options = options + ["--no-result"]
        writes_result = False
    argv = [sys.executable, f"benchmarks/{script}", "--quick", *options,
            *_out_option(script, tmp_path)]
    if script in ("startup.py", "throughput.py", "share_heap.py"):
        argv += ["--data-dir", str(tmp_path / "data")]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=220)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert expected in proc.stdout, proc.stdout[-3000:]
    if writes_result:
        rows = json.loads((tmp_path / "out" / "result.json").read_text())["rows"]
        assert rows, "result.json has no rows"
