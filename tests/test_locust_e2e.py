"""The Locust plugin leaves no server behind, whatever the sequence of Ctrl-C."""

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
