"""bottle.run(app, server="forkserve"): the caller's process is the master."""

import os
import signal
import subprocess
import sys
import time

import pytest

from forkserve_testing import LISTENING, ServerProcess, ctrl_c_reaches_it, poll

pytestmark = pytest.mark.e2e

APPS = os.path.join(os.path.dirname(__file__), "apps")


class ScriptServer(ServerProcess):
    """A server started by a user's script rather than by `python -m forkserve`."""

    def __init__(self, argv, log_dir):
        self.log_path = os.path.join(log_dir, f"script-{time.monotonic_ns()}.log")
        self.log_file = open(self.log_path, "w+b")
        self.proc = subprocess.Popen([sys.executable, *argv], cwd=APPS, stdout=self.log_file,
                                     stderr=subprocess.STDOUT, start_new_session=True,
                                     env=dict(os.environ, PYTHONUNBUFFERED="1"),
                                     preexec_fn=ctrl_c_reaches_it)
        self.port = None


@pytest.mark.parametrize("how", ["name", "class"])
def test_bottle_run_serves_from_forked_workers_that_share_the_callers_data(tmp_path, how):
    server = ScriptServer(["bottle_script.py", how], tmp_path)
    try:
        server.wait_listening()
        assert LISTENING.search(server.log())
        poll(lambda: len(server.children()) == 2, message="two workers")
        seen = set()

        def both_workers_served():
            # Each request is a new connection; which worker accepts it is the
            # kernel's choice, so ask until both have answered.
            answer = server.get_json("/user/user7@example.com")
            assert answer["loaded_by"] == server.pid  # loaded once, in the caller
            seen.add(answer["served_by"])
            return seen == set(server.children())
        poll(both_workers_served, message="both workers to answer")
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


def _group_alive(pgid):
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    # zombies (exited, not yet reaped by the test) do not count
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as handle:
                    fields = handle.read().rsplit(")", 1)[1].split()
            except (FileNotFoundError, ProcessLookupError):
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                return True
    return False


def test_bottle_reloader_restarts_on_a_change_and_leaves_nothing_after_ctrl_c(tmp_path):
    script = tmp_path / "reloading_script.py"
    script.write_text(
        "from gevent import monkey\n"
        "monkey.patch_all()\n"
        "import bottle\n"
        "import forkserve.bottle  # noqa: F401\n"
        "app = bottle.Bottle()\n"
        "@app.get('/')\n"
        "def index():\n"
        "    return 'VERSION'\n"
        "bottle.run(app, server='forkserve', host='127.0.0.1', port=0, workers=2,"
        " reloader=True)\n".replace("VERSION", "one"))
    server = ScriptServer([str(script)], tmp_path)
    try:
        server.wait_listening()
        assert server.get("/") == (200, "one")
        first = server.log().count("Listening at:")
        script.write_text(script.read_text().replace("'one'", "'two'"))
        stamp = time.time() + 2
        os.utime(script, (stamp, stamp))
        poll(lambda: server.log().count("Listening at:") > first, timeout=30,
             message="the restarted server")
        server.port = int(LISTENING.findall(server.log())[-1])
        poll(lambda: server.get("/") == (200, "two"), message="the edited app")
        assert "KeyError" not in server.log() and "Traceback" not in server.log()
        server.signal(signal.SIGINT)  # Ctrl-C reaching only Bottle's parent process
        server.wait_exit(15)
        poll(lambda: not _group_alive(server.pid), timeout=20,
             message="no forkserve master or worker left running")
    finally:
        server.kill_group()
