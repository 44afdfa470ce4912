"""examples/systemd: the .socket + .service pair, run with systemd-socket-activate
(systemd's own tool for socket activation outside systemd)."""

import configparser
import contextlib
import os
import pathlib
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys

import pytest

from forkserve_testing import kill_group, poll

pytestmark = pytest.mark.e2e

ROOT = pathlib.Path(__file__).resolve().parent.parent
APPS = ROOT / "tests" / "apps"
ACTIVATE = shutil.which("systemd-socket-activate") or next(
    (path for path in ("/lib/systemd/systemd-socket-activate",
                       "/usr/lib/systemd/systemd-socket-activate") if os.path.exists(path)), None)


def unit(name):
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str
    parser.read(ROOT / "examples" / "systemd" / name)
    return parser


def get(sock_path, path):
    with socket.socket(socket.AF_UNIX) as client:
        client.settimeout(30)
        client.connect(str(sock_path))
        client.sendall(f"GET {path} HTTP/1.0\r\n\r\n".encode())
        response = b"".join(iter(lambda: client.recv(4096), b""))
    return response.split(b"\r\n\r\n", 1)[1].decode()


def test_the_units_say_what_the_server_needs():
    service, sock = unit("forkserve.service"), unit("forkserve.socket")
    assert service["Service"]["Type"] == "notify"
    assert service["Service"]["ExecReload"] == "/bin/kill -HUP $MAINPID"
    assert service["Service"]["KillMode"] == "mixed"
    assert "forkserve.socket" in service["Unit"]["Requires"]
    assert sock["Socket"]["ListenStream"].startswith("/")
    assert " -b " not in service["Service"]["ExecStart"]  # the socket comes from systemd


@contextlib.contextmanager
def run_activated(tmp_path, extra=()):
    """The .service's ExecStart (its options, the test app) behind the .socket's
    ListenStream (moved into tmp_path), via systemd-socket-activate."""
    if ACTIVATE is None:
        pytest.skip("systemd-socket-activate is not installed (apt-get install systemd)")
    exec_start = shlex.split(unit("forkserve.service")["Service"]["ExecStart"])
    options = exec_start[1:-1]
    if "-c" in options:  # the project's config file: not part of this test
        at = options.index("-c")
        del options[at:at + 2]
    sock_path = tmp_path / os.path.basename(unit("forkserve.socket")["Socket"]["ListenStream"])
    log = open(tmp_path / "server.log", "w+b")
    proc = subprocess.Popen(
        [ACTIVATE, "-l", str(sock_path), sys.executable, "-m", "forkserve", *options, "-w", "2",
         *extra, "basic:app"], cwd=APPS, stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True)
    try:
        # The file exists once bound; connections are refused until it listens.
        poll(lambda: _listening(sock_path), timeout=20,
             message="systemd-socket-activate's socket to listen")
        yield proc, sock_path
    finally:
        kill_group(proc, 10)
        log.close()


def _listening(sock_path):
    if not sock_path.exists():
        return False
    with socket.socket(socket.AF_UNIX) as probe:
        try:
            probe.connect(str(sock_path))
        except ConnectionRefusedError:
            return False
    return True


def test_socket_activation_serves_reloads_and_stops_cleanly(tmp_path):
    with run_activated(tmp_path) as (proc, sock_path):
        first = get(sock_path, "/pid")  # the first connection starts the server
        assert first.isdigit()
        text = (tmp_path / "server.log").read_text()
        assert re.search(r"Listening at: unix:.*forkserve\.sock", text), text
        os.kill(proc.pid, signal.SIGHUP)  # ExecReload
        poll(lambda: "serves; the master continues as its supervisor" in
             (tmp_path / "server.log").read_text(), timeout=30, message="the reload")
        assert get(sock_path, "/pid").isdigit()
        os.kill(proc.pid, signal.SIGTERM)  # systemctl stop, KillMode=mixed
        assert proc.wait(30) == 0


def test_a_bind_beside_socket_activation_is_not_silently_ignored(tmp_path):
    with run_activated(tmp_path, extra=("-b", "127.0.0.1:1")) as (_, sock_path):
        assert get(sock_path, "/pid").isdigit()  # systemd's socket serves
        text = (tmp_path / "server.log").read_text()
        assert "bind (127.0.0.1:1, from command line) is ignored: systemd passed 1 listening " \
               "socket(s)" in text
