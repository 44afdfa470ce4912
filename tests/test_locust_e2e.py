"""The Locust plugin leaves no server behind, whatever the sequence of Ctrl-C,
and its memory samples under load carry figures read since the one before."""

import csv
import importlib.util
import os
import re
import signal
import subprocess
import sys

import pytest

from forkserve_testing import ctrl_c_reaches_it, kill_group, poll

# Only look for Locust: importing it here would monkey-patch this test process
# (gevent's child watcher would then reap other tests' children).
pytestmark = [pytest.mark.e2e, pytest.mark.skipif(
    importlib.util.find_spec("locust") is None, reason="Locust is not installed")]

APPS = os.path.join(os.path.dirname(__file__), "apps")


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("presses", [1, 2, 3])
def test_ctrl_c_pressed_any_number_of_times_stops_the_server(tmp_path, presses):
    prefix = tmp_path / "run"
    locust = subprocess.Popen(
        [sys.executable, "-m", "locust", "-f", "locust_slow.py", "--headless", "-u", "2",
         "-r", "2", "-t", "120s", "--csv", str(prefix), "--forkserve-app", "basic:app",
         "--forkserve-workers", "1", "--forkserve-args", "--graceful-timeout 60"],
        cwd=APPS, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True, preexec_fn=ctrl_c_reaches_it)
    log_path = tmp_path / "run_forkserve.log"
    try:
        def master_and_worker():
            text = log_path.read_text() if log_path.exists() else ""
            master = re.search(r"Using master pid (\d+)", text)
            worker = re.search(r"Booting worker 1 with pid: (\d+)", text)
            return master and worker and (int(master.group(1)), int(worker.group(1)))
        master, worker = poll(master_and_worker, timeout=60, message="forkserve started")
        history = tmp_path / "run_stats_history.csv"
        poll(lambda: history.exists() and len(history.read_text().splitlines()) >= 3,
             timeout=30, message="Locust's run under way (two rows of its stats history)")
        locust.send_signal(signal.SIGINT)
        poll(lambda: "Handling signal: term" in log_path.read_text(), timeout=30,
             message="the graceful stop to begin (slow requests in flight)")
        for _ in range(presses - 1):
            locust.send_signal(signal.SIGINT)
        locust.wait(30)
        poll(lambda: not alive(master) and not alive(worker), timeout=10,
             message="forkserve's master and worker gone")
    finally:
        kill_group(locust, 10)


def _locust(*args, cwd=APPS):
    return subprocess.Popen(
        [sys.executable, "-m", "locust", "-f", "locust_fast.py", "--headless", "-u", "8",
         "-r", "8", "--forkserve-app", "basic:app", "--forkserve-workers", "2", *args],
        cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True, preexec_fn=ctrl_c_reaches_it)


def test_ctrl_c_stops_the_users_before_the_server_and_the_run_exits_zero(tmp_path):
    prefix = tmp_path / "run"
    locust = _locust("-t", "120s", "--csv", str(prefix))
    try:
        history = tmp_path / "run_stats_history.csv"
        poll(lambda: history.exists() and len(history.read_text().splitlines()) >= 4,
             timeout=90, message="Locust's run under way (three rows of its stats history)")
        locust.send_signal(signal.SIGINT)
        output = locust.communicate(timeout=60)[0]
    finally:
        kill_group(locust, 10)
    assert locust.returncode == 0, output
    assert "Shutting down (exit code 0)" in output
    aggregated = [line for line in (tmp_path / "run_stats.csv").read_text().splitlines()
                  if ",Aggregated," in line][0].split(",")
    header = (tmp_path / "run_stats.csv").read_text().splitlines()[0].split(",")
    requests = int(aggregated[header.index("Request Count")])
    assert requests > 0 and aggregated[header.index("Failure Count")] == "0", output
    assert len((tmp_path / "run_failures.csv").read_text().splitlines()) == 1  # the header


def test_memory_samples_are_kept_without_csv(tmp_path):
    locust = _locust("-t", "4s", cwd=APPS)
    try:
        output = locust.communicate(timeout=120)[0]
    finally:
        kill_group(locust, 10)
    assert locust.returncode == 0, output
    path = re.search(r"samples: (\S+forkserve-memory-\S+\.csv)", output)
    assert path, output
    with open(path.group(1)) as samples:
        rows = samples.read().splitlines()
    os.unlink(path.group(1))
    assert rows[0].startswith("time,") and any(",total," in row for row in rows[1:])


def test_every_memory_sample_under_load_carries_figures_taken_since_the_one_before(tmp_path):
    """The server's counts move with Locust's from sample to sample: the stats
    endpoint's own pace (slower under load) does not make them stale."""
    prefix = tmp_path / "run"
    locust = _locust("-t", "16s", "--csv", str(prefix))
    try:
        output = locust.communicate(timeout=120)[0]
    finally:
        kill_group(locust, 10)
    assert locust.returncode == 0, output
    with open(tmp_path / "run_memory.csv", newline="") as samples:
        totals = [row for row in csv.DictReader(samples)
                  if row["role"] == "total" and int(row["users"]) > 0]
    counts = [int(row["server_requests"]) for row in totals]
    moved = sum(after != before for before, after in zip(counts, counts[1:]))
    assert len(counts) >= 6 and moved >= 0.8 * (len(counts) - 1), counts
    last = totals[-1]
    assert abs(counts[-1] - int(last["locust_requests"])) <= 0.2 * int(last["locust_requests"]), \
        (counts, last["locust_requests"])
