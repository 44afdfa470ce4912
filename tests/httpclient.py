"""Test helpers: start tests/httpserve.py in its own process group, and talk
raw HTTP/1.1 to it over plain (blocking) sockets."""

import os
import re
import select
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from httpcorpus import LIMITS

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = Path(__file__).resolve().parent / "httpserve.py"


class LiveServer:
    """tests/httpserve.py running in a subprocess; `port` is where it listens."""

    def __init__(self, tmp_path, **options):
        self.error_log = tmp_path / "error.log"
        self.access_log = tmp_path / "access.log"
        self.stderr_path = tmp_path / "stderr.log"
        self.unix = options.get("unix")
        args = [sys.executable, str(SCRIPT), "--error-log", str(self.error_log),
                "--access-log", str(self.access_log)]
        for name, value in options.items():
            args += ["--" + name.replace("_", "-"), str(value)]
        env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONWARNINGS="default::ResourceWarning")
        with open(self.stderr_path, "wb") as stderr:
            self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=stderr,
                                         env=env, start_new_session=True)
        self.port = int(self.read_line("PORT", deadline=time.monotonic() + 20).split()[1])

    def read_line(self, prefix, deadline):
        """The next stdout line starting with `prefix`, waiting until `deadline`."""
        stdout = self.proc.stdout
        while time.monotonic() < deadline:
            ready, _, _ = select.select([stdout], [], [], 0.05)
            if ready:
                line = stdout.readline().decode()
                if line.startswith(prefix):
                    return line
                if not line:
                    break
            elif self.proc.poll() is not None:
                break
        raise AssertionError(f"no {prefix!r} line from the server; stderr:\n{self.stderr()}")

    def signal(self, signum):
        os.killpg(self.proc.pid, signum)

    def stop(self):
        if self.proc.poll() is None:
            try:
                self.signal(signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(timeout=10)
        self.proc.stdout.close()

    def stderr(self):
        return self.stderr_path.read_text(errors="replace")

    def errors(self):
        return self.error_log.read_text(errors="replace") if self.error_log.exists() else ""

    def access(self):
        return self.access_log.read_text(errors="replace") if self.access_log.exists() else ""

    def connect(self, timeout=5.0):
        if self.unix:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(timeout)
            sock.connect(str(self.unix))
            return sock
        return socket.create_connection(("127.0.0.1", self.port), timeout=timeout)

    def exchange(self, raw, timeout=5.0):
        """Send `raw` on a new connection; return (first response, closed-after)."""
        with self.connect(timeout) as sock:
            sock.sendall(raw)
            reply = read_response(sock)
            return reply, is_closed(sock)

    def get(self, path="/", headers=""):
        """One GET on a new connection (closed without waiting for the server)."""
        with self.connect() as sock:
            sock.sendall(f"GET {path} HTTP/1.1\r\nHost: t\r\n{headers}\r\n".encode())
            return read_response(sock)


@dataclass
class Response:
    status: int
    headers: dict = field(default_factory=dict)  # lower-case name -> value
    body: bytes = b""
    complete: bool = True  # False if the connection closed before the body's end


class Reader:
    """Incremental reader over a blocking socket (keeps what it over-reads)."""

    def __init__(self, sock):
        self.sock = sock
        self.buf = b""

    def fill(self):
        data = self.sock.recv(65536)
        self.buf += data
        return bool(data)

    def until(self, marker):
        while marker not in self.buf:
            if not self.fill():
                return None
        head, _, self.buf = self.buf.partition(marker)
        return head

    def exactly(self, n):
        while len(self.buf) < n:
            if not self.fill():
                return None
        data, self.buf = self.buf[:n], self.buf[n:]
        return data


def read_response(sock, reader=None, head_request=False):
    """Read one response; None if the server closed without sending one."""
    reader = reader or Reader(sock)
    head = reader.until(b"\r\n\r\n")
    if head is None:
        assert not reader.buf, f"partial response head: {reader.buf!r}"
        return None
    lines = head.decode("latin-1").split("\r\n")
    match = re.fullmatch(r"HTTP/1\.1 (\d{3}) .*", lines[0])
    assert match, f"bad status line {lines[0]!r}"
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        assert name.lower() not in headers, f"duplicate response header {name}"
        headers[name.lower()] = value.strip()
    reply = Response(int(match.group(1)), headers)
    if head_request or reply.status in (204, 304):
        return reply
    if "content-length" in headers:
        body = reader.exactly(int(headers["content-length"]))
        reply.body, reply.complete = body or reader.buf, body is not None
    elif headers.get("transfer-encoding") == "chunked":
        parts = []
        while True:
            size_line = reader.until(b"\r\n")
            if size_line is None:
                reply.complete = False
                break
            size = int(size_line, 16)
            chunk = reader.exactly(size + 2)
            if chunk is None:
                reply.complete = False
                break
            parts.append(chunk[:-2])
            if size == 0:
                break
        reply.body = b"".join(parts)
    else:
        while reader.fill():
            pass
        reply.body = reader.buf
    return reply


def is_closed(sock, timeout=3.0):
    """True if the server closes the connection within `timeout` (data sent
    before the close is an error: the server must not answer twice)."""
    sock.settimeout(timeout)
    try:
        data = sock.recv(65536)
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False
    assert not data, f"unexpected data after the response: {data!r}"
    return True


def wait_closed(sock, timeout):
    """Seconds until the server closed `sock`, or None if it stayed open."""
    started = time.monotonic()
    return time.monotonic() - started if is_closed(sock, timeout) else None


@pytest.fixture
def fresh_server(tmp_path):
    """Start servers of one's own (corpus LIMITS unless overridden); they are
    killed at teardown. For tests that read logs, load or stop the server."""
    started = []

    def start(**options):
        path = tmp_path / f"server{len(started)}"
        path.mkdir()
        live = LiveServer(path, **{**LIMITS, **options})
        started.append(live)
        return live

    yield start
    for live in started:
        live.stop()
