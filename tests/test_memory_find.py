"""`forkserve memory` finds its server: by pid, pid file, stats address or title."""

import contextlib
import json
import os
import socket
import subprocess
import sys

import pytest

from forkserve.memory import copied_objects, find

GUNICORN = "gunicorn: master [app:app]"


@pytest.mark.parametrize("target, expected", [
    ("7831", ("pid", 7831)),
    (" 7831 ", ("pid", 7831)),
    ("127.0.0.1:9100", ("stats", "127.0.0.1:9100")),
    ("localhost:9100", ("stats", "localhost:9100")),
    ("http://[::1]:9100", ("stats", "http://[::1]:9100")),
    ("unix:/run/app/stats.sock", ("stats", "unix:/run/app/stats.sock")),
])
def test_a_target_is_a_pid_or_a_stats_address(target, expected):
    assert find.classify(target, isfile=lambda path: False) == expected


def test_an_existing_file_is_a_pid_file(tmp_path):
    pidfile = tmp_path / "app.pid"
    pidfile.write_text("7831\n")
    assert find.classify(str(pidfile)) == ("pidfile", str(pidfile))


def test_a_target_that_is_none_of_them_says_what_to_give(tmp_path):
    with pytest.raises(ValueError, match="not a pid, an existing pid file or a stats address: "
                                         "give the server's pid"):
        find.classify(str(tmp_path / "missing.pid"))


def _tree():
    return {
        100: ("forkserve: master [app:app]", 1),
        101: ("forkserve: worker 1 [app:app]", 100),
        102: ("forkserve: worker 2 [app:app]", 100),
        200: ("forkserve: supervisor [b:app] serving generation 2", 50),
        201: ("forkserve: generation 2 [b:app]", 200),
        202: ("forkserve: worker 1 [b:app]", 201),
        300: (GUNICORN, 1),
        301: ("gunicorn: worker [app:app]", 300),
        400: ("shop: master [shop:app]", 1),
        401: ("shop: worker 1 [shop:app]", 400),
        500: ("shop: supervisor [shop:app] serving generation 3", 1),
        503: ("shop: generation 3 [shop:app]", 500),
        600: ("shop: single [shop:app] 12 req", 1),
        700: ("shop: supervisor [shop:app] serving generation 2", 1),
        701: ("shop: generation 2 [shop:app]", 700),
    }


def test_the_servers_are_the_titled_processes_whose_parent_is_not_titled():
    # gunicorn's master titles look the same: a master with another --name
    # counts when it, or a generation under it, listens for --why; a single
    # process or a supervisor is forkserve's whatever its name.
    assert find.roots(_tree(), listeners={400, 503}) == [100, 200, 400, 500, 600, 700]


def test_a_worker_or_a_generations_master_leads_to_its_servers_root():
    tree = _tree()
    assert [find.root_of(pid, tree) for pid in (101, 100, 202, 201, 7)] == [100, 100, 200, 200, 7]


def test_why_listeners_are_read_from_proc_net_unix(tmp_path):
    (tmp_path / "net").mkdir()
    (tmp_path / "net" / "unix").write_text(
        "Num       RefCount Protocol Flags    Type St Inode Path\n"
        "0000000000000000: 00000002 00000000 00010000 0001 01 55219 @forkserve-why-4242\n"
        "0000000000000000: 00000002 00000000 00010000 0001 01 55220 /run/other.sock\n")
    assert find.why_listeners(str(tmp_path)) == {4242}


def test_walk_reports_progress_as_it_goes(monkeypatch):
    monkeypatch.setattr(copied_objects, "PROGRESS_EVERY", 0.0)
    monkeypatch.setattr(copied_objects, "_CLOCK_EVERY", 1000)
    seen = []
    _, _, walked = copied_objects.walk([__name__], set(), 12, progress=seen.append)
    assert len(seen) >= 2 and seen == sorted(seen) and seen[-1] <= walked


@pytest.mark.e2e
def test_memory_finds_a_server_started_without_pid_or_stats_by_its_pid(run_server):
    server = run_server("-w", "2", app="basic:app")
    workers = server.wait_workers(2)
    for target in (server.pid, workers[0]):  # a worker's pid leads to its master
        out = subprocess.run([sys.executable, "-m", "forkserve", "memory", str(target), "--json"],
                             capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        assert {row["pid"] for row in json.loads(out.stdout)["processes"]} == {
            server.pid, *workers}


@pytest.mark.e2e
def test_memory_without_a_target_finds_every_server_running(run_server):
    servers = [run_server("-w", "1", app="basic:app") for _ in range(2)]
    for server in servers:
        server.wait_workers(1)
    out = subprocess.run([sys.executable, "-m", "forkserve", "memory"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "forkserve servers are running; name one" in out.stdout
    for server in servers:  # two servers of one app, told apart by their addresses
        assert (f"{server.pid}  forkserve: master [basic:app] on 127.0.0.1:{server.port}: "
                "2 processes use ") in out.stdout


def test_listening_sockets_are_read_from_proc_net_tables():
    from forkserve.memory import procfs
    tcp = ("  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid"
           "  timeout inode\n"
           "   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000"
           "     0        0 4242 1 0000000000000000 100 0 0 10 0\n"
           "   1: 0100007F:C350 0100007F:1F90 01 00000000:00000000 00:00000000 00000000"
           "     0        0 4343 1 0000000000000000 20 4 30 10 -1\n")
    assert procfs.parse_listening(tcp) == {4242: "127.0.0.1:8080"}  # the connection is not
    tcp6 = ("  sl  local_address                         remote_address                        "
            "st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
            "   0: 00000000000000000000000001000000:0050 00000000000000000000000000000000:0000 0A"
            " 00000000:00000000 00:00000000 00000000     0        0 77 1 0 100 0 0 10 0\n")
    assert procfs.parse_listening(tcp6) == {77: "[::1]:80"}
    unix = ("Num       RefCount Protocol Flags    Type St Inode Path\n"
            "0000000000000000: 00000002 00000000 00010000 0001 01 9001 /run/app.sock\n"
            "0000000000000000: 00000003 00000000 00000000 0001 03 9002 /run/other.sock\n")
    assert procfs.parse_listening_unix(unix) == {9001: "unix:/run/app.sock"}


def test_a_descriptor_closed_while_listed_does_not_hide_the_listeners(tmp_path, monkeypatch):
    from forkserve.memory import procfs
    (tmp_path / "7" / "fd").mkdir(parents=True)
    (tmp_path / "7" / "net").mkdir()
    (tmp_path / "7" / "fd" / "3").symlink_to("socket:[4242]")
    (tmp_path / "7" / "fd" / "9").symlink_to("/gone")
    (tmp_path / "7" / "net" / "tcp").write_text(
        "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid"
        "  timeout inode\n   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000"
        " 00000000     0        0 4242 1 0000000000000000 100 0 0 10 0\n")
    readlink = os.readlink

    def closing(path):  # descriptor 9 closes between the listing and its readlink
        if path.endswith("/fd/9"):
            raise FileNotFoundError(path)
        return readlink(path)

    monkeypatch.setattr(os, "readlink", closing)
    assert procfs.listening_addresses(7, proc=str(tmp_path)) == ["127.0.0.1:8080"]


@pytest.mark.e2e
def test_a_servers_listening_addresses_are_read_from_proc(run_server):
    from forkserve.memory import procfs
    server = run_server("-w", "1", "--stats", "127.0.0.1:0", app="basic:app")
    assert f"127.0.0.1:{server.port}" in procfs.listening_addresses(server.pid)
    assert procfs.listening_addresses(2 ** 22 + 1) == []  # no such process


@pytest.mark.e2e
def test_why_of_a_master_explains_its_worker_and_reports_progress(run_server):
    server = run_server("-w", "1", app="basic:app")
    worker, = server.wait_workers(1)
    out = subprocess.run([sys.executable, "-m", "forkserve", "memory", "--why", str(server.pid),
                          "--json"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["pid"] == worker
    assert out.stderr == ""  # redirected: no progress line to land in a file (issue 33)
    # on a terminal, the progress line is shown and rewritten in place, then cleared
    import pty
    leader, follower = pty.openpty()
    try:
        out = subprocess.run([sys.executable, "-m", "forkserve", "memory", "--why",
                              str(server.pid), "--json"], stdout=subprocess.PIPE,
                             stderr=follower, text=True, timeout=120)
        os.close(follower)
        shown = b""
        with contextlib.suppress(OSError):  # EIO once the terminal's last writer is gone
            while chunk := os.read(leader, 4096):
                shown += chunk
    finally:
        os.close(leader)
    assert out.returncode == 0 and json.loads(out.stdout)["pid"] == worker
    assert b"\rforkserve memory --why: 0 objects walked, " in shown
    assert shown.endswith(b"\r\x1b[K")


@pytest.mark.e2e
def test_the_masters_generation_is_the_same_in_json_and_prometheus(run_server):
    import re
    import urllib.request
    server = run_server("-w", "1", "--stats", "127.0.0.1:0", app="basic:app")
    server.wait_workers(1)
    out = subprocess.run([sys.executable, "-m", "forkserve", "memory", str(server.pid),
                          "--json"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    [master] = [p for p in json.loads(out.stdout)["processes"] if p["role"] == "master"]
    stats = int(re.search(r"Stats at: http://127\.0\.0\.1:(\d+)", server.log()).group(1))
    with urllib.request.urlopen(f"http://127.0.0.1:{stats}/metrics", timeout=10) as reply:
        metrics = reply.read().decode()
    labels = re.search(r'\{[^}]*role="master"[^}]*\}', metrics).group(0)
    assert f'generation="{master["generation"]}"' in labels and master["generation"] == 1


def test_the_why_listener_forks_one_auditor_at_a_time():
    # Issue 33 item 6: each request forked the master, with no cap.
    # a child that stays until killed (it waits on a pipe no one writes), no timer
    sleeper = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                               stdin=subprocess.PIPE)
    forks = []

    def fork():  # the "auditor": a child of this process that stays until killed
        forks.append(sleeper.pid)
        return sleeper.pid

    listener = copied_objects.WhyListener(fork=fork)

    def ask():
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.settimeout(10)
            client.connect(copied_objects.socket_name(os.getpid()))
            client.sendall(b"123\n")
            listener.service(listener.filenos())
            try:
                return client.makefile("rb").read()
            except ConnectionResetError:  # the fake auditor never read the question
                return None

    try:
        assert ask() is None and forks == [sleeper.pid]  # forked (a fake auditor: no answer)
        busy = json.loads(ask())
        assert forks == [sleeper.pid] and "one runs at a time" in busy["error"]
        sleeper.kill()
        sleeper.wait()
        ask()
        assert forks == [sleeper.pid] * 2  # once it is gone, the next request forks
    finally:
        sleeper.kill()
        sleeper.wait()
        sleeper.stdin.close()
        listener.close()
