"""Faults: crashing apps, killed and stuck workers, and privilege dropping."""

import http.client
import os
import random
import signal
import threading
import time

import pytest

from forkserve_testing import poll

pytestmark = pytest.mark.e2e


def test_application_exception_gives_500_and_the_worker_keeps_serving(run_server):
    server = run_server("-w", "1")
    [worker] = server.wait_workers(1)
    status, body = server.get("/boom")
    assert status == 500 and "boom requested" not in body  # no traceback to the client
    assert server.get("/pid") == (200, str(worker))
    assert "RuntimeError: boom requested" in server.log()


def test_workers_killed_at_random_under_load_only_fail_their_in_flight_requests(run_server):
    server = run_server("-w", "3", "--graceful-timeout", "5")
    server.wait_workers(3)
    outcomes = {"ok": 0, "failed": 0, "bad_status": 0}
    lock, stop = threading.Lock(), threading.Event()

    def client():
        deadline = time.monotonic() + 30
        while not stop.is_set() and time.monotonic() < deadline:
            try:
                status = server.get("/slow?0.02", timeout=10)[0]
                key = "ok" if status == 200 else "bad_status"
            except (OSError, http.client.HTTPException):
                key = "failed"
            with lock:
                outcomes[key] += 1

    clients = [threading.Thread(target=client) for _ in range(6)]
    for thread in clients:
        thread.start()
    kills = 0
    rng = random.Random(7)
    try:
        for _ in range(5):
            poll(lambda: len(server.children()) == 3, message="three workers")
            victim = rng.choice(server.children())
            served = outcomes["ok"]
            os.kill(victim, signal.SIGKILL)
            kills += 1
            poll(lambda: victim not in server.children() and outcomes["ok"] > served + 5,
                 message="the victim reaped and serving going on")
        served = outcomes["ok"]
        # Serving goes on: well past the requests the kills failed (however
        # slowly a loaded machine serves them).
        poll(lambda: outcomes["ok"] > max(served + 20, 10 * outcomes["failed"]),
             message="serving to go on")
    finally:
        stop.set()
        for thread in clients:
            thread.join(15)
    # Each kill can only fail the requests that worker had in flight, and
    # with six clients at most six requests are in flight at any moment.
    assert outcomes["bad_status"] == 0
    assert outcomes["failed"] <= kills * 6, outcomes
    assert outcomes["ok"] > 10 * outcomes["failed"], outcomes
    assert len(server.wait_workers(3)) == 3
    assert server.log().count("was killed by SIGKILL") == kills


def test_worker_stuck_in_a_request_past_timeout_is_killed_and_others_serve_on(run_server,
                                                                            tmp_path):
    server = run_server("-w", "2", "--timeout", "1", env={"MARK_DIR": str(tmp_path)})
    workers = server.wait_workers(2)
    stuck = {}

    def block():
        try:
            stuck["answer"] = server.get("/block?30", timeout=20)
        except (OSError, http.client.HTTPException) as exc:
            stuck["error"] = exc

    blocker = threading.Thread(target=block)
    blocker.start()
    # Only once the stuck worker is blocked can it take no more connections;
    # a request it accepted before that would be in flight on it, and lost.
    poll(lambda: any(name.startswith("block-") for name in os.listdir(tmp_path)),
         message="the blocking request to start")
    statuses = []
    deadline = time.monotonic() + 20
    while blocker.is_alive() and time.monotonic() < deadline:
        statuses.append(server.get("/pid", timeout=10)[0])
    blocker.join(5)
    assert "error" in stuck, stuck  # the client saw its connection closed, not an answer
    assert statuses and set(statuses) == {200}
    assert "timed out" in server.log()
    assert len(set(server.wait_workers(2)) - set(workers)) == 1


@pytest.mark.skipif(os.geteuid() != 0, reason="dropping privileges needs a root master")
def test_workers_drop_privileges_after_binding(run_server):
    import pwd
    nobody = pwd.getpwnam("nobody")
    server = run_server("-w", "1", "--user", "nobody")
    server.wait_workers(1)
    who = server.get_json("/whoami")
    assert (who["uid"], who["gid"]) == (nobody.pw_uid, nobody.pw_gid)
    with open(f"/proc/{server.pid}/status") as handle:
        assert any(line.split()[:2] == ["Uid:", "0"] for line in handle)


def test_unknown_user_is_a_clear_error(run_server):
    server = run_server("-w", "1", "--user", "no-such-user-here", wait=False)
    assert server.wait_exit(15) == 2
    assert "--user 'no-such-user-here': no such user" in server.log()


def test_replacement_workers_killed_one_after_another_never_stop_the_server(run_server):
    # What the kernel's OOM killer does to a memory-heavy service: each new
    # worker is SIGKILLed as soon as it appears, before or just after it is
    # ready. The master replaces each (with a backoff) and never gives up.
    server = run_server("-w", "2")
    first = server.wait_workers(2)
    seen = set(first)
    victim = first[0]
    for _ in range(10):
        os.kill(victim, signal.SIGKILL)
        victim = poll(lambda: new_worker(server, seen), timeout=20, interval=0.005,
                      message="a replacement worker")
        seen.add(victim)
    os.kill(victim, signal.SIGKILL)
    assert server.proc.poll() is None, server.log()
    assert len(server.wait_workers(2, timeout=30)) == 2
    assert server.get("/pid")[0] == 200
    log = server.log()
    assert "failed to boot" not in log
    assert log.count("was killed by SIGKILL") == 11


def new_worker(server, seen):
    """A worker of `server` not in `seen`; fails at once if the server is gone."""
    assert server.proc.poll() is None, f"the server stopped:\n{server.log()}"
    return next((pid for pid in server.children() if pid not in seen), None)
