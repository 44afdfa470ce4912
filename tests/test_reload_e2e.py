"""HUP reloads code and data under load: no failed request, same master PID."""

import os
import re
import signal
import threading
import time

import pytest

from forkserve_testing import poll

pytestmark = pytest.mark.e2e


class Load:
    """A bounded request loop on fresh connections, counting failures."""

    def __init__(self, server, seconds=60):
        self.server, self.deadline = server, time.monotonic() + seconds
        self.answers, self.failures, self.stop = [], [], threading.Event()
        self.thread = threading.Thread(target=self.run)

    def run(self):
        while not self.stop.is_set() and time.monotonic() < self.deadline:
            try:
                status, body = self.server.get("/", timeout=10)
                if status != 200:
                    self.failures.append(status)
                self.answers.append(body.split()[0])
            except OSError as exc:
                self.failures.append(repr(exc))

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(15)


STATS = re.compile(r"Stats at: http://127\.0\.0\.1:(\d+)")
HANDED_OVER = re.compile(r"continues as its supervisor|Generation \d+ \(pid \d+\) exited")


def _reload_to(server, version_file, version, signum=signal.SIGHUP):
    """HUP, then wait until the new version answers and the old one is gone."""
    handovers = len(HANDED_OVER.findall(server.log()))
    version_file.write_text(version)
    server.signal(signum)
    poll(lambda: server.get("/")[1].split()[0] == version, timeout=30,
         message=f"answers from {version}")
    poll(lambda: len(HANDED_OVER.findall(server.log())) > handovers, timeout=30,
         message="the old generation to finish draining")


@pytest.mark.parametrize("workers", ["2", "0"])
def test_three_reloads_under_load_lose_no_request(run_server, tmp_path, workers):
    version_file = tmp_path / "version"
    version_file.write_text("v1")
    pidfile = tmp_path / "server.pid"
    server = run_server("-w", workers, "--pid", str(pidfile), "--graceful-timeout", "10",
                        app="versioned:app", env={"VERSION_FILE": str(version_file)})
    master = server.pid
    assert server.get("/")[1].startswith("v1")
    with Load(server) as load:
        for version in ("v2", "v3", "v4"):
            _reload_to(server, version_file, version)
            assert int(pidfile.read_text()) == master and server.proc.poll() is None
        served_before = len(load.answers)
        poll(lambda: len(load.answers) > served_before + 5, message="more answers")
    assert load.failures == []
    assert len(load.answers) > 20
    assert load.answers[-1] == "v4"
    assert "v1" in load.answers  # the loop ran across every reload
    server.signal(signal.SIGTERM)
    assert server.wait_exit(20) == 0
    with pytest.raises(ProcessLookupError):
        os.killpg(master, 0)  # no process left behind
    assert not pidfile.exists()


def test_a_reload_with_a_broken_app_keeps_serving_the_old_answers(run_server, tmp_path):
    version_file = tmp_path / "version"
    version_file.write_text("v1")
    server = run_server("-w", "2", "--stats", "127.0.0.1:0", app="versioned:app",
                        env={"VERSION_FILE": str(version_file)})
    _reload_to(server, version_file, "v2")
    with Load(server) as load:
        version_file.write_text("broken")
        server.signal(signal.SIGHUP)
        poll(lambda: "Reload failed" in server.log(), timeout=30, message="the failed reload")
        answers_then = len(load.answers)
        poll(lambda: len(load.answers) > answers_then + 5, message="more answers")
    assert load.failures == []
    assert set(load.answers) == {"v2"}
    log = server.log()
    assert "the dataset does not parse" in log
    assert "the previous generation keeps serving" in log
    _reload_to(server, version_file, "v3")  # and a good reload still works afterwards
    server.signal(signal.SIGTERM)
    assert server.wait_exit(20) == 0


@pytest.mark.parametrize("workers", ["1", "0"])
def test_usr2_reloads_as_hup_does(run_server, tmp_path, workers):
    version_file = tmp_path / "version"
    version_file.write_text("v1")
    server = run_server("-w", workers, app="versioned:app",
                        env={"VERSION_FILE": str(version_file)})
    _reload_to(server, version_file, "v2", signal.SIGUSR2)  # the master's reload
    _reload_to(server, version_file, "v3", signal.SIGUSR2)  # the supervisor's
    server.signal(signal.SIGTERM)
    assert server.wait_exit(20) == 0


@pytest.mark.parametrize("workers", ["1", "0"])
def test_the_stats_dashboard_history_survives_the_exec_into_the_supervisor(
        run_server, tmp_path, workers):
    import json
    import urllib.request

    version_file = tmp_path / "version"
    version_file.write_text("v1")
    server = run_server("-w", workers, "--stats", "127.0.0.1:0", app="versioned:app",
                        env={"VERSION_FILE": str(version_file)})
    port = int(poll(lambda: STATS.search(server.log()), message="the stats line").group(1))

    def history():
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/history", timeout=10) as answer:
            return json.load(answer)
    poll(lambda: len(history()["points"]) >= 2, message="two samples before the reload")
    before = history()["points"][0]["t"]
    _reload_to(server, version_file, "v2")
    assert "continues as its supervisor" in server.log()
    poll(lambda: "supervisor" in history()["points"][-1]["values"],
         message="a sample taken by the supervisor")
    points = history()["points"]
    assert points[0]["t"] == before  # the master's samples are still there
    assert "supervisor" not in points[0]["values"]

    def served_under_the_supervisor():  # the rate, from the generation's titles
        server.get("/")
        return any(point["rate"] and "supervisor" in point["values"]
                   for point in history()["points"])
    poll(served_under_the_supervisor, message="a request rate under the supervisor")


def test_the_first_reload_frees_the_old_heap_by_exec(run_server, tmp_path):
    version_file = tmp_path / "version"
    version_file.write_text("v1")
    server = run_server("-w", "1", app="versioned:app",
                        env={"VERSION_FILE": str(version_file), "BALLAST_MB": "150"})
    assert _rss(server.pid) > 150 * 2**20  # the master holds the "dataset"
    _reload_to(server, version_file, "v2")
    # Same PID, but the exec into the supervisor released the old heap.
    poll(lambda: _rss(server.pid) < 75 * 2**20, message="the master's RSS to drop")
    assert server.get("/")[1].startswith("v2")


def _rss(pid):
    with open(f"/proc/{pid}/status") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def _loading(version_file):
    """Pids of the generations that are loading (held) or have loaded a held version."""
    return {int(path.name.rsplit(".", 1)[1])
            for path in version_file.parent.glob(version_file.name + ".loading.*")}


def _held_reload(server, version_file, version):
    """HUP into a generation that stays in the middle of loading; its pid."""
    before = _loading(version_file)
    version_file.write_text(f"{version} hold")
    server.signal(signal.SIGHUP)
    [pid] = poll(lambda: _loading(version_file) - before, timeout=30,
                 message="the new generation to be loading")
    return pid


def _release(version_file):
    version_file.with_name(version_file.name + ".go").touch()


def _answer(server):
    return server.get("/")[1].split()[0]


def _versioned(run_server, tmp_path, workers, *args):
    version_file = tmp_path / "version"
    version_file.write_text("v1")
    server = run_server("-w", workers, "--graceful-timeout", "10", *args, app="versioned:app",
                        env={"VERSION_FILE": str(version_file)})
    return server, version_file


@pytest.mark.parametrize("workers, supervised", [("1", False), ("0", False), ("1", True)])
def test_hup_during_a_reload_reloads_again_once_it_is_done(run_server, tmp_path, workers,
                                                           supervised):
    server, version_file = _versioned(run_server, tmp_path, workers)
    old = "v1"
    if supervised:  # the supervisor's reload, not the master's first one
        _reload_to(server, version_file, "v1b")
        old = "v1b"
    started = server.log().count("Reloading: started generation")
    _held_reload(server, version_file, "v2")
    version_file.write_text("v3")
    server.signal(signal.SIGHUP)
    poll(lambda: "Hang up during a reload" in server.log(), message="the HUP to be remembered")
    assert _answer(server) == old  # the old generation serves while the new one loads
    _release(version_file)
    poll(lambda: _answer(server) == "v3", timeout=30, message="answers from v3")
    poll(lambda: len(HANDED_OVER.findall(server.log())) >= 2 + supervised,
         timeout=30, message="the v2 generation to be gone")
    assert server.log().count("Reloading: started generation") == started + 2
    server.signal(signal.SIGTERM)
    assert server.wait_exit(20) == 0


@pytest.mark.parametrize("supervised", [False, True])
def test_ttin_and_ttou_during_a_reload_change_the_incoming_generation(run_server, tmp_path,
                                                                      supervised):
    # Issue 33 item 5: they used to change the outgoing generation's workers,
    # and were lost with it.
    server, version_file = _versioned(run_server, tmp_path, "2")
    if supervised:
        _reload_to(server, version_file, "v1b")
    held = _held_reload(server, version_file, "v2")
    for count, signum in enumerate((signal.SIGTTIN, signal.SIGTTIN, signal.SIGTTIN,
                                    signal.SIGTTOU), 1):
        server.signal(signum)  # one at a time: standard signals coalesce
        poll(lambda: server.log().count("during a reload: generation") == count,
             message=f"signal {count} counted for the new generation")
    assert "gets 2 workers more once it serves" in server.log()
    _release(version_file)
    poll(lambda: _answer(server) == "v2", timeout=30, message="answers from v2")
    poll(lambda: len(server_children(held)) == 4, timeout=30,
         message="the new generation at 4 workers")
    assert "TTIN: 3 workers" in server.log() and "TTIN: 4 workers" in server.log()
    # a generation's log names the pid to signal: the master's, the pid file's (item 6)
    assert (f"Generation {2 + supervised} runs in pid {held} with 2 workers; send signals "
            f"to the master, pid {server.pid} (the pid file's)") in server.log()
    server.signal(signal.SIGTERM)
    assert server.wait_exit(20) == 0


def server_children(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as handle:
            return handle.read().split()
    except FileNotFoundError:
        return []


@pytest.mark.parametrize("workers, supervised", [("1", False), ("0", False), ("1", True)])
def test_term_during_a_reload_stops_the_starting_generation_too(run_server, tmp_path, workers,
                                                                supervised):
    server, version_file = _versioned(run_server, tmp_path, workers)
    if supervised:
        _reload_to(server, version_file, "v1b")
    held = _held_reload(server, version_file, "v2")
    server.signal(signal.SIGTERM)
    assert server.wait_exit(20) == 0
    poll(lambda: not os.path.exists(f"/proc/{held}"), message="the loading generation to go")
    with pytest.raises(ProcessLookupError):
        os.killpg(server.pid, 0)  # nothing left behind


@pytest.mark.parametrize("workers, supervised", [("1", False), ("0", False), ("1", True)])
def test_a_new_generation_that_dies_before_it_is_ready_leaves_the_old_one_serving(
        run_server, tmp_path, workers, supervised):
    server, version_file = _versioned(run_server, tmp_path, workers)
    old = "v1"
    if supervised:
        _reload_to(server, version_file, "v1b")
        old = "v1b"
    held = _held_reload(server, version_file, "v2")
    os.kill(held, signal.SIGKILL)
    poll(lambda: "Reload failed" in server.log(), message="the failed reload")
    assert "the previous generation keeps serving" in server.log()
    assert {_answer(server) for _ in range(5)} == {old}
    _reload_to(server, version_file, "v3")  # and the next reload works
    server.signal(signal.SIGTERM)
    assert server.wait_exit(20) == 0


class HeldRequest:
    """A request to /held, in flight until release(): it keeps a drain going."""

    def __init__(self, server, version_file):
        self.version_file = version_file
        self.result = []
        self.thread = threading.Thread(
            target=lambda: self.result.append(server.get("/held", timeout=60)))
        self.thread.start()
        poll(lambda: list(version_file.parent.glob(version_file.name + ".held.*")),
             message="the held request to reach the application")

    def release(self):
        self.version_file.with_name(self.version_file.name + ".answer").touch()
        self.thread.join(30)
        return self.result


def test_single_process_hup_while_the_old_generation_drains_starts_another(
        run_server, tmp_path):
    server, version_file = _versioned(run_server, tmp_path, "0")
    held = HeldRequest(server, version_file)
    version_file.write_text("v2")
    server.signal(signal.SIGHUP)
    poll(lambda: "Handing over: draining" in server.log(), timeout=30,
         message="generation 1 to drain")
    version_file.write_text("v3")
    server.signal(signal.SIGHUP)  # while generation 1 drains its held request
    poll(lambda: _answer(server) == "v2", timeout=30, message="answers from v2")
    assert [status for status, _ in held.release()] == [200]
    poll(lambda: _answer(server) == "v3", timeout=30, message="answers from v3 (generation 3)")
    assert "started generation 3" in server.log()
    server.signal(signal.SIGTERM)
    assert server.wait_exit(20) == 0


def test_single_process_term_while_the_old_generation_drains_stops_the_new_one(
        run_server, tmp_path):
    pidfile = tmp_path / "server.pid"
    server, version_file = _versioned(run_server, tmp_path, "0", "--pid", str(pidfile))
    held = HeldRequest(server, version_file)
    version_file.write_text("v2")
    server.signal(signal.SIGHUP)
    poll(lambda: _answer(server) == "v2", timeout=30, message="answers from v2")
    [new] = [pid for pid in server.children()]
    server.signal(signal.SIGTERM)  # while generation 1 drains its held request
    held.release()
    assert server.wait_exit(30) == 0
    assert not os.path.exists(f"/proc/{new}")  # reaped by the server before it exited
    assert "Generation 2 (pid" in server.log()
    with pytest.raises(ProcessLookupError):
        os.killpg(server.pid, 0)  # nothing left behind


def _gone(pid):
    """The process left (or is a zombie nobody reaped yet)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def _descendants(pid):
    found = []
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as handle:
            children = [int(child) for child in handle.read().split()]
    except FileNotFoundError:
        return found
    for child in children:
        found += [child, *_descendants(child)]
    return found


@pytest.mark.parametrize("workers, supervised", [("1", False), ("1", True), ("0", True)])
def test_workers_and_generations_stop_when_their_parent_is_killed(run_server, tmp_path,
                                                                  workers, supervised):
    server, version_file = _versioned(run_server, tmp_path, workers)
    if supervised:
        _reload_to(server, version_file, "v2")
    left = poll(lambda: _descendants(server.pid), message="the server's children")
    server.signal(signal.SIGKILL)
    for pid in left:
        poll(lambda: _gone(pid), timeout=15, message=f"pid {pid} to stop with no parent")


def test_an_old_generation_that_ignores_the_stop_is_killed_with_its_workers(run_server,
                                                                           tmp_path):
    version_file = tmp_path / "version"
    version_file.write_text("v1")
    server = run_server("-w", "1", "--graceful-timeout", "1", app="versioned:app",
                        env={"VERSION_FILE": str(version_file)})
    _reload_to(server, version_file, "v2")  # the supervisor's reloads from here on
    [old] = server.children()
    old_workers = poll(lambda: _descendants(old), message="generation 2's worker")
    _held_reload(server, version_file, "v3")
    os.kill(old, signal.SIGSTOP)  # a generation whose loop no signal reaches
    _release(version_file)
    poll(lambda: _answer(server) == "v3", timeout=30, message="answers from v3")
    for pid in [old, *old_workers]:
        poll(lambda: _gone(pid), timeout=30, message=f"pid {pid} of generation 2 to be killed")
    assert re.search(r"Sending SIGKILL to generation 2 \(pid \d+\) and its 1 workers",
                     server.log())
    server.signal(signal.SIGTERM)
    assert server.wait_exit(20) == 0
