"""Issue 22 item 3: a request body the server refused reaches the client as
the refusal (408, 400, 413) and a close, not as the 500 a framework answers
after catching the error from wsgi.input, and the framework's traceback for
it is not logged (the server logs the refusal once)."""

import socket

import pytest

from forkserve_testing import poll
from httpclient import Reader, read_response

pytestmark = pytest.mark.e2e

APPS = ["body_readers:bottle_app", "body_readers:flask_app"]


def _answer(port, head, body, *, after_head=None):
    """Send a POST /upload with `head` lines and `body`; the response and
    whether the server closed the connection after it."""
    raw = ("POST /upload HTTP/1.1\r\nHost: t\r\n" + "".join(h + "\r\n" for h in head)
           + "\r\n").encode() + body
    with socket.create_connection(("127.0.0.1", port), timeout=15) as sock:
        sock.sendall(raw)
        reader = Reader(sock)
        reply = read_response(sock, reader)
        closed = sock.recv(1) == b""
    return reply, closed


CASES = [
    pytest.param(["Content-Length: 10"], b"x", 408, "request body not received", id="timeout"),
    pytest.param(["Transfer-Encoding: chunked"], b"zz\r\nabc\r\n", 400, "invalid chunk-size",
                 id="bad-chunk"),
    pytest.param(["Transfer-Encoding: chunked"], b"40\r\n" + b"x" * 64 + b"\r\n0\r\n\r\n", 413,
                 "chunked body over the 32-byte limit", id="too-large"),
]


@pytest.mark.parametrize("app", APPS)
@pytest.mark.parametrize("head, body, status, logged", CASES)
def test_refused_body_reaches_the_client_as_the_refusal_not_the_frameworks_500(
        run_server, app, head, body, status, logged):
    server = run_server("-w", "0", "--body-timeout", "1", "--limit-request-body", "32", app=app)
    reply, closed = _answer(server.port, head, body)
    assert reply.status == status, reply
    assert reply.headers.get("connection") == "close" and closed
    poll(lambda: f"{status} {logged}" in server.log(), message="the refusal in the log")
    assert "Traceback" not in server.log(), server.log()


@pytest.mark.parametrize("app", APPS)
def test_framework_still_serves_a_good_body(run_server, app):
    server = run_server("-w", "0", app=app)
    reply, _ = _answer(server.port, ["Content-Length: 5"], b"hello")
    assert reply.status == 200 and b'"received"' in reply.body and b"5" in reply.body
