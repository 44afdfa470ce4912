"""Issue 33 item 2: a chunked request body reaches Bottle, Flask and Django
applications as the same body sent with Content-Length. The server de-chunks
it, so the environ must not say Transfer-Encoding: chunked (Bottle would
de-chunk it again and answer 400, as it does under Gunicorn) and must say
CONTENT_LENGTH (Django reads that many bytes, Bottle too without chunked)."""

import json
import socket
import urllib.parse

import pytest

from forkserve_testing import poll
from httpclient import Reader, read_response
from test_bottle_e2e import ScriptServer

pytestmark = pytest.mark.e2e

FORM = urllib.parse.urlencode({"text": "hello chunked world", "pad": "x" * 300}).encode()


def _chunked(data, size):
    out = b""
    for start in range(0, len(data), size):
        piece = data[start:start + size]
        out += b"%x\r\n" % len(piece) + piece + b"\r\n"
    return out + b"0\r\n\r\n"


def _post(port, framing, body=FORM):
    """POST /echo with `body` framed as `framing` on one keep-alive connection,
    twice (the second request shows the first was read to its end); the
    replies, decoded."""
    head = ("POST /echo HTTP/1.1\r\nHost: t\r\n"
            "Content-Type: application/x-www-form-urlencoded\r\n")
    if framing == "chunked":
        raw = (head + "Transfer-Encoding: chunked\r\n\r\n").encode() + _chunked(body, 97)
    else:
        raw = (head + f"Content-Length: {len(body)}\r\n\r\n").encode() + body
    replies = []
    with socket.create_connection(("127.0.0.1", port), timeout=15) as sock:
        reader = Reader(sock)
        for _ in range(2):
            sock.sendall(raw)
            reply = read_response(sock, reader)
            replies.append((reply.status, json.loads(reply.body) if reply.status == 200
                            else reply.body))
    return replies


EXPECTED = {"length": len(FORM), "text": "hello chunked world", "body": FORM.decode()}


@pytest.mark.parametrize("framing", ["chunked", "content-length"])
@pytest.mark.parametrize("app", ["body_echo:bottle_app", "body_echo:flask_app",
                                 "body_echo:django_app"])
def test_a_framework_reads_a_chunked_body_as_it_reads_a_counted_one(run_server, app, framing):
    server = run_server("-w", "1", app=app)
    assert _post(server.port, framing) == [(200, EXPECTED)] * 2
    assert "Traceback" not in server.log()


def test_a_chunked_body_larger_than_the_memory_spool_arrives_whole(run_server):
    big = urllib.parse.urlencode({"text": "big", "pad": "y" * (3 << 20)}).encode()
    server = run_server("-w", "0", app="body_echo:flask_app")
    [(status, answer), _] = _post(server.port, "chunked", big)
    assert status == 200 and answer["length"] == len(big) and answer["text"] == "big"


@pytest.mark.parametrize("framing", ["chunked", "content-length"])
def test_bottles_adapter_serves_a_chunked_body(tmp_path, framing):
    server = ScriptServer(["body_echo.py"], tmp_path)
    try:
        server.wait_listening()
        poll(lambda: len(server.children()) == 1, message="the worker")
        assert _post(server.port, framing) == [(200, EXPECTED)] * 2
    finally:
        server.kill_group()
