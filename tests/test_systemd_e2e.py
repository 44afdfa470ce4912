"""systemd integration: socket activation (LISTEN_FDS) and sd_notify (NOTIFY_SOCKET)."""

import os
import signal
import socket
import subprocess
import sys

import pytest


pytestmark = pytest.mark.e2e

APPS = os.path.join(os.path.dirname(__file__), "apps")


def test_socket_activation_and_readiness_notification(tmp_path):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    port = listener.getsockname()[1]
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(tmp_path / "notify"))
    notify.settimeout(20)
    log = open(tmp_path / "server.log", "w+b")
    # Like systemd: the socket as fd 3, LISTEN_PID naming the server's own pid.
    launcher = (
        "import os, sys\n"
        f"os.dup2({listener.fileno()}, 3)\n"
        "os.environ.update(LISTEN_PID=str(os.getpid()), LISTEN_FDS='1')\n"
        "os.execv(sys.executable, [sys.executable, '-m', 'forkserve', '-w', '2',\n"
        "                          '-b', '127.0.0.1:1', 'basic:app'])\n")
    proc = subprocess.Popen([sys.executable, "-c", launcher], cwd=APPS,
                            pass_fds=[listener.fileno()],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            env=dict(os.environ, NOTIFY_SOCKET=str(tmp_path / "notify")))
    try:
        listener.close()  # the server owns it now
        assert notify.recv(4096) == b"READY=1"
        # -b 127.0.0.1:1 was not bound (it would need root): the passed socket serves.
        answers = set()
        for _ in range(10):
            with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
                client.sendall(b"GET /pid HTTP/1.0\r\n\r\n")
                response = b""
                while chunk := client.recv(4096):
                    response += chunk
                answers.add(response.split(b"\r\n\r\n", 1)[1])
        assert answers and all(answer.isdigit() for answer in answers)
        os.kill(proc.pid, signal.SIGHUP)
        assert notify.recv(4096).startswith(b"RELOADING=1\nMONOTONIC_USEC=")
        assert notify.recv(4096) == b"READY=1"
        os.kill(proc.pid, signal.SIGHUP)  # a second reload, now from the supervisor
        assert notify.recv(4096).startswith(b"RELOADING=1\nMONOTONIC_USEC=")
        assert notify.recv(4096) == b"READY=1"
        os.kill(proc.pid, signal.SIGTERM)
        assert notify.recv(4096) == b"STOPPING=1"
        assert proc.wait(20) == 0
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(5)
        log.seek(0)
        print(log.read().decode(errors="replace"))
        log.close()
        notify.close()
