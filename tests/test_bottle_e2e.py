"""bottle.run(app, server="forkserve"): the caller's process is the master."""

import os
import signal
import subprocess
import sys
import time

import pytest

from forkserve_testing import LISTENING, ServerProcess, poll

pytestmark = pytest.mark.e2e

APPS = os.path.join(os.path.dirname(__file__), "apps")


class ScriptServer(ServerProcess):
    """A server started by a user's script rather than by `python -m forkserve`."""

    def __init__(self, argv, log_dir):
        self.log_path = os.path.join(log_dir, f"script-{time.monotonic_ns()}.log")
        self.log_file = open(self.log_path, "w+b")
        self.proc = subprocess.Popen([sys.executable, *argv], cwd=APPS, stdout=self.log_file,
                                     stderr=subprocess.STDOUT, start_new_session=True,
                                     env=dict(os.environ, PYTHONUNBUFFERED="1"))
        self.port = None


@pytest.mark.parametrize("how", ["name", "class"])
def test_bottle_run_serves_from_forked_workers_that_share_the_callers_data(tmp_path, how):
    server = ScriptServer(["bottle_script.py", how], tmp_path)
    try:
        server.wait_listening()
        assert LISTENING.search(server.log())
        poll(lambda: len(server.children()) == 2, message="two workers")
        seen = set()
        for _ in range(40):
            answer = server.get_json("/user/user7@example.com")
            assert answer["loaded_by"] == server.pid  # loaded once, in the caller
            seen.add(answer["served_by"])
        assert seen == set(server.children())
        assert server.get("/user/nobody@example.com")[0] == 404
        server.signal(signal.SIGTERM)
        assert server.wait_exit(15) == 0
        assert "bottle.run returned" in server.log()
    finally:
        server.kill_group()


def test_bottle_run_with_an_unknown_setting_says_which():
    script = ("import bottle, forkserve.bottle\n"
              "bottle.run(bottle.Bottle(), server='forkserve', port=0, wrokers=2)\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=30)
    assert out.returncode != 0
    assert "unknown forkserve settings ['wrokers']" in out.stderr
