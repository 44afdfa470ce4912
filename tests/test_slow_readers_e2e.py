"""Slow readers of large responses, on every write path (a response held in
the Outbox and finished by the hub, one send with --no-batch-responses, a
streamed body, sendfile, the uwsgi listener), against a real server and a
client socket with a small receive buffer that reads at a fixed rate:

- send_timeout bounds a stall, not a download: a client that keeps taking
  bytes finishes, however long it takes; one that stops is cut once it has
  taken nothing for send_timeout, and the cut is logged (WARNING);
- the keep-alive wait counts from when the response was written whole: the
  next request on the connection is answered after a download slower than
  --keep-alive.
"""

import re
import socket
import threading
import time

import pytest

from forkserve.http.uwsgi import encode_packet
from forkserve_testing import poll

pytestmark = pytest.mark.e2e

MiB = 1 << 20
#: bytes a second the slow reader takes: SIZE lasts about 3 s, three times
#: --send-timeout and --keep-alive (1 s) in these tests
RATE = 4_000_000
SIZE = 12 * MiB
RCVBUF = 32 * 1024
UWSGI_LISTENING = re.compile(r"Listening at: uwsgi://127\.0\.0\.1:(\d+)")
CUT = re.compile(r"response cut: (.*)")


def _server(run_server, tmp_path, *args):
    sent_file = tmp_path / "sent.bin"
    sent_file.write_bytes(b"f" * SIZE)
    server = run_server("-w", "0", "-b", "uwsgi:127.0.0.1:0", *args, app="downloads:app",
                        env={"SENT_FILE": str(sent_file)})
    server.uwsgi_port = poll(lambda: (m := UWSGI_LISTENING.search(server.log()))
                             and int(m.group(1)), message="the uwsgi Listening at: line")
    return server


class SlowClient:
    """One connection with a small receive buffer."""

    def __init__(self, port):
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF)
        self.sock.settimeout(30)
        self.sock.connect(("127.0.0.1", port))
        self.buffer = b""

    def close(self):
        self.sock.close()

    def request(self, path, uwsgi=False):
        if uwsgi:
            self.sock.sendall(encode_packet([
                ("REQUEST_METHOD", "GET"), ("PATH_INFO", path), ("REQUEST_URI", path),
                ("QUERY_STRING", ""), ("SERVER_PROTOCOL", "HTTP/1.1"),
                ("SERVER_NAME", "test"), ("SERVER_PORT", "80"), ("REMOTE_ADDR", "127.0.0.1")]))
        else:
            self.sock.sendall(f"GET {path} HTTP/1.1\r\nHost: test\r\n\r\n".encode())

    def head(self):
        """The response's status and Content-Length."""
        while b"\r\n\r\n" not in self.buffer:
            data = self.sock.recv(4096)
            assert data, f"EOF before the response head: {self.buffer!r}"
            self.buffer += data
        head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        length = int(re.search(rb"(?i)\r\ncontent-length: *(\d+)", head).group(1))
        return int(head.split()[1]), length

    def read(self, count, rate=None):
        """Up to `count` body bytes (fewer at EOF), taken at `rate` bytes a
        second if given; their number."""
        got = min(len(self.buffer), count)
        self.buffer = self.buffer[got:]
        started = time.monotonic()
        while got < count:
            if rate is not None:  # pace the reads: the client's speed, not a wait for the server
                ahead = got / rate - (time.monotonic() - started)
                if ahead > 0:
                    time.sleep(ahead)
            data = self.sock.recv(min(65536, count - got))
            if not data:
                break
            got += len(data)
        return got

    def rest_until_eof(self):
        got = len(self.buffer)
        self.buffer = b""
        while data := self.sock.recv(65536):
            got += len(data)
        return got


PATHS = ["/whole", "/stream", "/file"]


def _download_then_next(port, path, uwsgi, results):
    client = SlowClient(port)
    try:
        client.request(f"{path}/{SIZE}", uwsgi)
        status, length = client.head()
        started = time.monotonic()
        got = client.read(length, RATE)
        took = time.monotonic() - started
        nxt = None
        if not uwsgi:  # uwsgi connections carry one request (nginx's uwsgi_pass)
            client.request("/small")
            nxt = client.head()[0], client.read(2)
        results[path, uwsgi] = (status, length, got, took, nxt)
    finally:
        client.close()


@pytest.mark.parametrize("batch", [(), ("--no-batch-responses",)], ids=["batched", "no-batch"])
def test_a_download_slower_than_send_and_keep_alive_timeouts_completes_and_the_next_request_is_answered(
        run_server, tmp_path, batch):
    server = _server(run_server, tmp_path, "--send-timeout", "1", "--keep-alive", "1", *batch)
    results = {}
    threads = [threading.Thread(target=_download_then_next, args=(port, path, uwsgi, results))
               for path in PATHS for port, uwsgi in ((server.port, False),
                                                     (server.uwsgi_port, True))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(results) == len(threads), server.log()
    for (path, uwsgi), (status, length, got, took, nxt) in results.items():
        assert (status, length, got) == (200, SIZE, SIZE), (path, uwsgi, server.log())
        assert took > 2, (path, uwsgi, took)  # the reader was slower than both timeouts
        if not uwsgi:
            assert nxt == (200, 2), (path, server.log())
    assert "response cut" not in server.log()


@pytest.mark.parametrize("batch", [(), ("--no-batch-responses",)], ids=["batched", "no-batch"])
@pytest.mark.parametrize("path", PATHS)
def test_a_client_that_stops_reading_is_cut_after_send_timeout_and_the_cut_is_logged(
        run_server, tmp_path, path, batch):
    size = 64 * MiB if path != "/file" else SIZE
    server = _server(run_server, tmp_path, "--send-timeout", "1", *batch)
    client = SlowClient(server.port)
    try:
        client.request(f"{path}/{size}")
        assert client.head() == (200, size)
        assert client.read(MiB) == MiB  # then reads nothing
        cut = poll(lambda: CUT.search(server.log()), timeout=20, message="the cut's log line")
        line = cut.group(1)
        assert line.startswith(f"GET {path}/{size} HTTP/1.1 from 127.0.0.1, "), line
        assert f" of {size:,} body bytes sent: the client took no byte for 1 s " \
               "(--send-timeout)" in line, line
        sent = int(re.search(r", ([\d,]+) of", line).group(1).replace(",", ""))
        assert MiB <= sent < size
        # what the client still gets is what had gone out, then EOF
        assert MiB + client.rest_until_eof() == sent
    finally:
        client.close()
    assert re.search(r"WARNING.*response cut", server.log()), server.log()


def test_a_client_gone_mid_body_is_logged(run_server, tmp_path):
    server = _server(run_server, tmp_path)
    client = SlowClient(server.port)
    client.request(f"/whole/{64 * MiB}")
    client.head()
    client.read(MiB)
    client.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    client.close()  # a reset, with the response's rest unread
    line = poll(lambda: CUT.search(server.log()), timeout=20, message="the cut's log line").group(1)
    assert line.startswith(f"GET /whole/{64 * MiB} HTTP/1.1 from 127.0.0.1, "), line
    assert re.search(r"body bytes sent: the client went away \(E\w+\)$", line), line
