"""daemon = True with a pid file, beside the real Gunicorn: the command returns
at once, the detached server serves, is found and stopped through its pid
file, and leaves nothing running."""

import http.client
import os
import re
import signal
import subprocess
import sys

import pytest

from forkserve_testing import poll

pytestmark = pytest.mark.e2e

APPS = os.path.join(os.path.dirname(__file__), "apps")


def session_members(sid):
    """Pids of the processes in session `sid`."""
    members = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as handle:
                    fields = handle.read().rpartition(")")[2].split()
            except (FileNotFoundError, ProcessLookupError):
                continue
            if int(fields[3]) == sid:  # after ")": state ppid pgrp session
                members.append(int(entry))
    return members


@pytest.mark.parametrize("server", ["forkserve", "gunicorn"])
def test_a_daemon_serves_and_is_stopped_by_its_pid_file(server, tmp_path):
    if server == "gunicorn":
        pytest.importorskip("gunicorn")
    pid_path, log_path = tmp_path / "server.pid", tmp_path / "error.log"
    args = ["-b", "127.0.0.1:0", "-w", "2", "-D", "-p", str(pid_path),
            "--error-logfile" if server == "forkserve" else "--log-file", str(log_path),
            "basic:app"]
    started = subprocess.run([sys.executable, "-m", server, *args], cwd=APPS, timeout=60,
                             stdin=subprocess.DEVNULL, capture_output=True)
    # the command returns once detached, with its standard streams left alone
    assert started.returncode == 0 and started.stdout == b"", started
    port = poll(lambda: log_path.exists() and (re.search(
        r"Listening at: http://127\.0\.0\.1:(\d+)", log_path.read_text()) or None),
        message="Listening at in the error log")
    port = int(port.group(1))
    master = poll(lambda: pid_path.exists() and pid_path.read_text().strip().isdigit()
                  and int(pid_path.read_text()), message="the pid file")
    sid = os.getsid(master)
    try:
        assert sid != os.getsid(0) and sid != master  # a session of its own, not its leader
        for fd in (0, 1, 2):  # logging goes to the error log file
            assert os.path.realpath(f"/proc/{master}/fd/{fd}") == os.devnull
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        connection.request("GET", "/pid")
        response = connection.getresponse()
        assert response.status == 200 and int(response.read()) != master
        connection.close()
        os.kill(int(pid_path.read_text()), signal.SIGTERM)
        poll(lambda: not session_members(sid), timeout=30, message="every process gone")
        assert not pid_path.exists()
    finally:
        for pid in session_members(sid):
            os.kill(pid, signal.SIGKILL)
