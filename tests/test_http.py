"""forkserve.http: limits, strict parsing, timeouts, errors and the access log.

Unit tests drive the pure parsing functions, and wsgi.input over the
connection object fed bytes (the request corpora run on the connection
object in tests/test_corpus.py); e2e tests run tests/httpserve.py in a
subprocess and talk raw HTTP.
"""

import io
import json
import os
import re
import socket
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from forkserve.http.body import Body
from forkserve.http.h1 import (ClientDisconnected, Limits, RequestError, body_framing, chunk_size,
                               escape, header_field, request_head, request_line)
from forkserve.http.protocol import Connection, Request
from httpclient import LiveServer, Reader, fresh_server, is_closed, read_response, wait_closed  # noqa: F401
from httpcorpus import GOOD, LIMITS, REJECTED, chunked, post, request

# --- unit: the grammar ---------------------------------------------------------


def test_request_line_parses_method_target_and_version():
    assert request_line(b"GET /a?b HTTP/1.1\r\n", 100) == (
        "GET", "/a?b", "HTTP/1.1", "GET /a?b HTTP/1.1")
    assert request_line(b"PATCH /%E9 HTTP/1.0\r\n", 100) == (
        "PATCH", "/%E9", "HTTP/1.0", "PATCH /%E9 HTTP/1.0")
    assert request_line(b"GET / HTTP/1.7\r\n", 100) == (
        "GET", "/", "HTTP/1.1", "GET / HTTP/1.7")


def test_request_line_cut_by_eof_is_not_a_request():
    assert request_line(b"GET / HT", 100) is None


@pytest.mark.parametrize("line, status", [
    (b"GET /" + b"a" * 50 + b" HTTP/1.1\r\n", 414),
    (b"GET /" + b"a" * 100, 414),  # filled the read without reaching the line end
    (b"GET / HTTP/1.1\n", 400),
    (b"GET / HTTP/2.0\r\n", 505),
    (b"GET / HTTP/1.10\r\n", 400),
    (b"G T / HTTP/1.1\r\n", 400),
    (b"GET /\x00 HTTP/1.1\r\n", 400),
    (b"GET /\xe9 HTTP/1.1\r\n", 400),
])
def test_request_line_rejections_carry_their_status(line, status):
    with pytest.raises(RequestError) as caught:
        request_line(line, 50)
    assert caught.value.status == status


def test_header_field_strips_optional_whitespace_only_around_the_value():
    assert header_field(b"X-A: \t a  b \t\r\n", 100) == ("X-A", "a  b")
    assert header_field(b"X-A:\r\n", 100) == ("X-A", "")
    assert header_field(b"X-A: \xe9\r\n", 100) == ("X-A", "\xe9")


_HEAD_TEXT = st.text(alphabet="aZ09-_/:. \t\r\n\xe9\x00\x7f%?*!", max_size=8)


@st.composite
def head_lines(draw):
    """A request line and field lines, most of them valid, near the edges of the grammar."""
    def part(usual):  # one in eight is any text
        return draw(_HEAD_TEXT if draw(st.integers(0, 7)) == 0 else st.sampled_from(usual))

    lines = [f"{part(['GET', 'M-1!', 'get'])} {part(['/', '/a?b=c', '*', 'http://h/x'])} "
             f"{part(['HTTP/1.1', 'HTTP/1.0', 'HTTP/1.9', 'HTTP/2.0'])}"]
    for _ in range(draw(st.integers(0, 4))):
        lines.append(part(["Host", "X-A", "x_b"]) + ":" + part(["v", " \t a  b \t", "", "\xe9"]))
    return [line.encode("latin-1") for line in lines]


@settings(max_examples=800, suppress_health_check=[HealthCheck.too_slow])
@given(head_lines())
def test_request_head_reads_a_head_as_request_line_and_header_field_do_line_by_line(lines):
    """The whole-head parse is a shortcut: whatever it accepts, the line
    parsers accept with the same result; what it declines, they judge."""
    head = b"".join(line + b"\r\n" for line in lines)
    parsed = request_head(head.decode("latin-1"))
    if parsed is None:
        return
    method, target, version, text, fields = parsed
    assert request_line(lines[0] + b"\r\n", 1000) == (method, target, version, text)
    assert fields == [header_field(line + b"\r\n", 1000) for line in lines[1:]]


def test_request_head_declines_what_the_line_parsers_must_judge():
    assert request_head("GET / HTTP/1.1\r\nHost: a\r\n") == (
        "GET", "/", "HTTP/1.1", "GET / HTTP/1.1", [("Host", "a")])
    for head in ("GET / HTTP/2.0\r\n", "GET / HTTP/1.1\r\nX : y\r\n",
                 "GET / HTTP/1.1\r\n y\r\n", "GET / HTTP/1.1\r\nX: a\rb\r\n",
                 "\r\nGET / HTTP/1.1\r\n", "GET /\xe9 HTTP/1.1\r\n"):
        assert request_head(head) is None


@pytest.mark.parametrize("version, te, cls, expected", [
    ("HTTP/1.1", None, [], (False, 0)),
    ("HTTP/1.1", None, ["0012"], (False, 12)),
    ("HTTP/1.1", "chunked", [], (True, None)),
    ("HTTP/1.1", "Chunked", [], (True, None)),
    ("HTTP/1.1", " chunked ", [], (True, None)),
])
def test_body_framing_accepts_one_unambiguous_framing(version, te, cls, expected):
    assert body_framing(version, te, cls, 100) == expected


@pytest.mark.parametrize("version, te, cls, status", [
    ("HTTP/1.1", "chunked", ["5"], 400),
    ("HTTP/1.0", "chunked", [], 400),
    ("HTTP/1.1", "gzip, chunked", [], 501),
    ("HTTP/1.1", "chunked, gzip", [], 400),
    ("HTTP/1.1", "chunked,chunked", [], 400),
    ("HTTP/1.1", None, ["5", "5"], 400),
    ("HTTP/1.1", None, ["\xb2"], 400),
    ("HTTP/1.1", None, ["101"], 413),
])
def test_body_framing_refuses_ambiguity_and_oversize(version, te, cls, status):
    with pytest.raises(RequestError) as caught:
        body_framing(version, te, cls, 100)
    assert caught.value.status == status


def test_chunk_size_accepts_extensions_and_refuses_garbage():
    assert chunk_size(b"1aF\r\n") == 0x1AF
    assert chunk_size(b'5 ; a = b ;c="q \\" x"\r\n') == 5
    assert chunk_size(b"5") is None  # EOF mid-line
    for line in (b"5;\r\n", b"x\r\n", b"5 \r\n", b"1" * 17 + b"\r\n", b"5\n"):
        with pytest.raises(RequestError):
            chunk_size(line)


@pytest.mark.parametrize("method, target, expected", [
    ("GET", "/a/b?x=1", ("/a/b", "x=1", None)),
    ("GET", "/a?", ("/a", "", None)),
    ("OPTIONS", "*", ("*", "", None)),
    ("GET", "http://h.test:81/p?q", ("/p", "q", "h.test:81")),
    ("GET", "HTTPS://h.test", ("/", "", "h.test")),
    ("GET", "http://h.test?q", ("/", "q", "h.test")),
    ("GET", "http://[::1]:8/", ("/", "", "[::1]:8")),
])
def test_request_target_splits_every_form_rfc9112_3_2(method, target, expected):
    from forkserve.http.h1 import request_target
    assert request_target(method, target) == expected


@pytest.mark.parametrize("method, target, status", [
    ("GET", "/p#f", 400), ("GET", "*", 400), ("CONNECT", "h.test:443", 501),
    ("GET", "h.test:443", 400), ("GET", "ftp://h.test/", 400), ("GET", "http:///p", 400),
    ("GET", "http://u@h.test/", 400), ("GET", "http://h test/", 400),
])
def test_request_target_refusals_carry_their_status(method, target, status):
    from forkserve.http.h1 import request_target
    with pytest.raises(RequestError) as caught:
        request_target(method, target)
    assert caught.value.status == status


def test_valid_host_follows_rfc9110_7_2():
    from forkserve.http.h1 import valid_host
    for good in ("a.test", "a.test:80", "127.0.0.1", "[::1]", "[::1]:8000", "", "xn--e-9a.test:"):
        assert valid_host(good), good
    for bad in ("a b", "a/b", "a:8x", "u@a", "a\tb", "[::1", "caf\xe9"):
        assert not valid_host(bad), bad


def test_trailers_may_not_carry_framing_routing_or_authentication_fields():
    from forkserve.http.h1 import trailer_allowed
    assert trailer_allowed("X-Checksum") and trailer_allowed("Server-Timing")
    for name in ("Content-Length", "transfer-encoding", "Host", "Authorization", "Trailer"):
        assert not trailer_allowed(name), name


def test_header_field_size_counts_the_crlf_as_gunicorn_does():
    line = b"X-A: " + b"v" * 93 + b"\r\n"  # 100 bytes with its CRLF
    assert header_field(line, 100) == ("X-A", "v" * 93)
    longer = b"X-A: " + b"v" * 94 + b"\r\n"  # 101 bytes: readline(100) stops before its LF
    with pytest.raises(RequestError) as caught:
        header_field(longer[:100], 100)
    assert caught.value.status == 431


def test_limit_zero_means_what_gunicorn_documents():
    limits = Limits(limit_request_line=0, limit_request_fields=0, limit_request_field_size=0)
    assert (limits.line_max, limits.fields_max, limits.field_size_max) == (1 << 20, 32768, 1 << 20)
    assert Limits(limit_request_fields=40000).fields_max == 32768


def test_escape_leaves_only_printable_ascii():
    assert escape("GET /plain HTTP/1.1") == "GET /plain HTTP/1.1"
    assert escape('a"b\\c\nd\x1b\xe9\x7f') == "a\\x22b\\x5cc\\x0ad\\x1b\\xe9\\x7f"


def test_limits_refuse_negative_values():
    with pytest.raises(ValueError, match="keep_alive"):
        Limits(keep_alive=-1)
    assert Limits(limit_request_line=0).line_max == 1 << 20  # "unlimited", with a ceiling
    assert Limits(limit_request_line=9000).line_max == 8190  # gunicorn's maximum


# --- unit: wsgi.input --------------------------------------------------------


def body(data, length=None, chunked_=False, **limits):
    """wsgi.input for a POST whose body (and what follows it) is `data`, and
    its connection object; the client sends nothing more."""
    framing = "Transfer-Encoding: chunked" if chunked_ else f"Content-Length: {length}"
    connection = Connection(Limits(**limits))
    connection.receive_data(f"POST / HTTP/1.1\r\nHost: t\r\n{framing}\r\n\r\n".encode() + data)
    assert isinstance(connection.next_event(), Request)
    return Body(connection, lambda: connection.receive_data(b"")), connection


def respond(connection, draining=False):
    if draining:
        connection.drain()
    connection.response_head("200 OK", [], b"ok", 2, "Thu, 01 Jan 1970 00:00:00 GMT")
    connection.response_end()


_WHOLE_HEADS = ["GET / HTTP/1.1\r\nHost: t\r\n\r\n", "HEAD / HTTP/1.1\r\nHost: t\r\n\r\n",
                "GET / HTTP/1.0\r\n\r\n", "GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
                "GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"]


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(_WHOLE_HEADS),
       st.sampled_from(["200 OK", "204 No Content", "304 Not Modified", "404 Not Found"]),
       st.lists(st.sampled_from([("Content-Type", "text/plain"), ("Content-Length", "2"),
                                 ("Content-Length", "5"), ("Connection", "close"),
                                 ("Date", "x")]), max_size=3, unique=True),
       st.sampled_from([b"", b"ok", b"hello"]), st.sampled_from([Limits(), Limits(keep_alive=0)]))
def test_a_whole_response_is_the_head_and_end_one_by_one(head, status, headers, data, limits):
    """Connection.whole_response, the responder's one step for a body given
    at once, ends in the same bytes and the same state as response_head()
    and response_end() (and any error is the same)."""
    def serve(one_step):
        connection = Connection(limits)
        connection.receive_data(head.encode())
        assert isinstance(connection.next_event(), Request)
        try:
            if one_step:
                out = connection.whole_response(status, list(headers), data, "D")
                assert out is not None
            else:
                out = connection.response_head(status, list(headers), data, len(data), "D")
                out += connection.response_end()
        except Exception as error:
            return ("error", type(error), str(error))
        return (out, connection.code, connection.keep_alive, connection.sent,
                connection.response_problem, connection.our_state, connection.start_next_cycle())
    assert serve(True) == serve(False)


def test_a_whole_response_waits_while_keep_alive_depends_on_what_may_be_readable():
    draining = Connection(Limits())
    draining.receive_data(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
    draining.next_event()
    draining.drain()
    unread = Connection(Limits())
    unread.receive_data(b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\nab")
    unread.next_event()
    for connection in (draining, unread):
        assert connection.whole_response("200 OK", [], b"ok", "D") is None
        assert connection.our_state == "IDLE" and connection.code is None  # nothing decided


def test_body_reads_exactly_content_length_then_eof():
    b, connection = body(b"line1\nline2GET /", length=11)
    assert b.readline() == b"line1\n"
    assert b.read() == b"line2"
    assert b.read() == b"" and b.done
    assert connection.trailing_data == b"GET /"  # the next request is untouched


def test_body_reads_chunked_with_extensions_and_trailers():
    b, connection = body(b"5;x=1\r\nhel\nl\r\n3\r\nabc\r\n0\r\nX-T: 1\r\n\r\nNEXT", chunked_=True)
    assert list(b) == [b"hel\n", b"labc"]
    assert b.done and connection.trailing_data == b"NEXT"


def test_a_chunked_body_is_buffered_whole_in_memory_and_beyond_the_spool_on_disk(monkeypatch):
    from forkserve.http import body as body_module
    b, connection = body(b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\nNEXT", chunked_=True)
    spooled, size = body_module.buffered(b)
    assert (size, spooled.read(), spooled.readline()) == (11, b"hello world", b"")
    assert not spooled._rolled and b.done and connection.trailing_data == b"NEXT"
    spooled.close()
    monkeypatch.setattr(body_module, "SPOOL_BYTES", 8)
    b, _ = body(b"5\r\nhe\nlo\r\n6\r\n world\r\n0\r\n\r\n", chunked_=True)
    spooled, size = body_module.buffered(b)
    with spooled:
        assert spooled._rolled and size == 11 and list(spooled) == [b"he\n", b"lo world"]


def test_buffering_a_bad_chunked_body_raises_its_refusal():
    from forkserve.http.body import buffered
    b, _ = body(b"5\r\nhello\r\nzz\r\n", chunked_=True)
    with pytest.raises(RequestError, match="chunk-size"):
        buffered(b)


def test_chunked_trailer_carrying_content_type_is_read_and_dropped():
    # Gunicorn's corpus, valid/012: RFC 9110 6.5.1 lets a recipient discard it
    b, connection = body(b"5\r\nhello\r\n6\r\n world\r\n0\r\nVary: *\r\n"
                         b"Content-Type: text/plain\r\n\r\nNEXT", chunked_=True)
    assert b.read() == b"hello world" and b.done
    assert connection.trailing_data == b"NEXT"


def test_chunked_trailer_that_would_change_framing_is_refused():
    for field in (b"Content-Length: 3", b"Transfer-Encoding: chunked", b"Trailer: X"):
        b, _ = body(b"3\r\nabc\r\n0\r\n" + field + b"\r\n\r\n", chunked_=True)
        with pytest.raises(RequestError) as caught:
            b.read()
        assert caught.value.status == 400, field


def test_chunked_body_over_limit_raises_413_and_stays_failed():
    b, connection = body(b"400\r\n" + b"x" * 1024 + b"\r\n400\r\n", chunked_=True,
                         limit_request_body=1500)
    assert len(b.read(1024)) == 1024
    with pytest.raises(RequestError) as caught:
        b.read(10)
    assert caught.value.status == 413
    with pytest.raises(RequestError):
        b.read(10)
    assert not connection.keep_alive


def test_body_cut_short_raises_client_disconnected():
    b, _ = body(b"abc", length=10)
    with pytest.raises(ClientDisconnected):
        b.read()


@pytest.mark.parametrize("failure", [RequestError(408, "request body not received in time"),
                                     ClientDisconnected("gone")])
def test_a_body_that_failed_closes_the_connection_whatever_the_application_answers(failure):
    """The connection, not its driver, decides the close after a failed body
    read: a timeout (raised by the driver's fill), a bad chunk, a client gone."""
    connection = Connection(Limits())
    connection.receive_data(b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\nabc")
    assert isinstance(connection.next_event(), Request)

    def fill():
        raise failure
    b = Body(connection, fill)
    with pytest.raises(type(failure)):
        b.read()
    assert connection.body_error is failure and connection.unread_body
    respond(connection)  # the application caught it and answered anyway
    assert not connection.keep_alive and not connection.start_next_cycle()


def test_draining_closes_after_the_response_unless_a_request_is_pipelined():
    connection = Connection(Limits())
    connection.receive_data(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
    connection.next_event()
    connection.drain()
    assert connection.wants_peek()  # a pipelined request may be readable: look first
    respond(connection)
    assert not connection.start_next_cycle()
    connection = Connection(Limits())
    connection.receive_data(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n" * 2)
    connection.next_event()
    connection.drain()
    assert not connection.wants_peek()
    respond(connection)
    assert connection.start_next_cycle() and isinstance(connection.next_event(), Request)


def test_small_unread_body_all_received_is_skipped_and_the_connection_kept():
    _, connection = body(b"x" * 100 + b"GET / HTTP/1.1\r\nHost: t\r\n\r\n", length=100)
    respond(connection)
    assert connection.keep_alive and connection.start_next_cycle()
    assert isinstance(connection.next_event(), Request)


def test_unread_body_not_all_received_or_large_closes_the_connection():
    _, partial = body(b"x" * 10, length=100)
    respond(partial)
    assert not partial.keep_alive and not partial.start_next_cycle()
    _, large = body(b"x" * 70000, length=70000)
    respond(large)
    assert not large.keep_alive


def test_keep_alive_is_decided_once_by_version_connection_and_draining():
    def head(raw, draining=False):
        connection = Connection(Limits())
        connection.receive_data(raw)
        connection.next_event()
        respond(connection, draining)
        return connection.keep_alive
    assert head(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
    assert not head(b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
    assert not head(b"GET / HTTP/1.0\r\n\r\n")
    assert head(b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
    assert not head(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n", draining=True)
    pipelined = b"GET / HTTP/1.1\r\nHost: t\r\n\r\n" * 2
    assert head(pipelined, draining=True)  # the request already sent is answered


@pytest.mark.parametrize("value", ["close", "Close", "CLOSE", "keep-alive", "Keep-Alive",
                                   "keep-Alive", "KEEP-ALIVE", "upgrade", "close, upgrade",
                                   "Upgrade, Keep-Alive", " close", "keep-alive\t"])
@pytest.mark.parametrize("version", ["HTTP/1.0", "HTTP/1.1"])
def test_connection_header_keeps_the_connection_by_its_tokens_whatever_their_case(value,
                                                                                   version):
    # RFC 9112 9.3/9.6: HTTP/1.1 closes on the `close` token, HTTP/1.0 keeps only on
    # `keep-alive`; tokens are case-insensitive, whether alone or in a list
    connection = Connection(Limits())
    connection.receive_data(f"GET / {version}\r\nHost: t\r\nConnection: {value}\r\n\r\n"
                            .encode())
    connection.next_event()
    respond(connection)
    tokens = [token.strip(" \t").lower() for token in value.split(",")]
    expected = "close" not in tokens and (version == "HTTP/1.1" or "keep-alive" in tokens)
    assert connection.keep_alive is expected


@pytest.mark.parametrize("fields", ["Connection: keep-alive, close",
                                    "Connection: close, keep-alive", "Connection: Keep-Alive,CLOSE",
                                    "Connection: keep-alive\r\nConnection: close"])
@pytest.mark.parametrize("version", ["HTTP/1.0", "HTTP/1.1"])
def test_close_wins_over_keep_alive_in_the_same_request(fields, version, head_path):
    # RFC 9112 9.6: a request with the close option closes, whatever else it lists
    connection = Connection(Limits())
    connection.receive_data(f"GET / {version}\r\nHost: t\r\n{fields}\r\n\r\n".encode())
    assert isinstance(connection.next_event(), Request)
    head = connection.response_head("200 OK", [], b"ok", 2, "D")
    assert not connection.keep_alive and b"\r\nConnection: close\r\n" in head
    connection.response_end()
    assert not connection.start_next_cycle()


def test_expect_100_continue_is_owed_until_the_first_body_read():
    connection = Connection(Limits())
    connection.receive_data(b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n"
                            b"Expect: 100-continue\r\n\r\n")
    assert connection.next_event().expect_continue and connection.continue_pending
    sent = []
    b = Body(connection, lambda: (sent.append(connection.send_continue()),
                                  connection.receive_data(b"hi")))
    assert b.read() == b"hi" and sent == [b"HTTP/1.1 100 Continue\r\n\r\n"]
    assert not connection.continue_pending


# --- e2e -----------------------------------------------------------------------

e2e = pytest.mark.e2e


@pytest.fixture(scope="module", params=[0, 1], ids=["direct", "batched"])
def server(tmp_path_factory, request):
    """The test server, writing each whole response as it is made, and
    (`batched`) at the end of its loop's pass (an Outbox, forkserve's default)."""
    live = LiveServer(tmp_path_factory.mktemp("http"), batch_responses=request.param, **LIMITS)
    yield live
    live.stop()


# Every class of refusal runs on the connection object in tests/test_corpus.py;
# these few run end to end, through a real socket.

def refused(cls, status):
    corpus_status, raws = REJECTED[cls]
    assert corpus_status == status
    return [pytest.param(raw, id=repr(raw[:60])[2:-1]) for raw in raws]


def assert_refused(server, raw, status):
    reply, closed = server.exchange(raw)
    assert reply is not None, "closed without a response"
    assert reply.status == status, reply
    assert reply.headers.get("connection") == "close"
    assert closed, "connection left open after the refusal"


@e2e
@pytest.mark.parametrize("raw", GOOD)
def test_good_requests_get_200(server, raw):
    with server.connect() as sock:
        sock.sendall(raw)
        reader = Reader(sock)
        reply = read_response(sock, reader, head_request=raw.startswith(b"HEAD"))
        assert reply.status == 200, reply
        if raw.count(b" HTTP/1.") == 2:  # pipelined
            assert read_response(sock, reader).status == 200


@e2e
def test_keep_alive_connection_serves_many_requests(server):
    with server.connect() as sock:
        reader = Reader(sock)
        for i in range(20):
            sock.sendall(post([f"Content-Length: {len(str(i))}"], str(i).encode()))
            assert read_response(sock, reader).body == str(i).encode()


@e2e
@pytest.mark.parametrize("raw", refused("request_line_over_limit", 414))
def test_request_line_over_limit_gets_414_and_close(server, raw):
    assert_refused(server, raw, 414)


@e2e
@pytest.mark.parametrize("raw", refused("chunked_body_over_body_limit", 413))
def test_chunked_body_over_body_limit_gets_413_while_reading_and_close(server, raw):
    assert_refused(server, raw, 413)


@e2e
@pytest.mark.parametrize("raw", refused("content_length_with_transfer_encoding", 400))
def test_content_length_with_transfer_encoding_gets_400_and_close(server, raw):
    assert_refused(server, raw, 400)


@e2e
@pytest.mark.parametrize("raw", refused("bare_lf_line_ending", 400))
def test_bare_lf_line_ending_gets_400_and_close(server, raw):
    assert_refused(server, raw, 400)


@e2e
def test_each_refusal_logs_one_line_without_traceback(fresh_server):
    live = fresh_server()
    for cls in ("request_line_over_limit", "duplicate_content_length", "chunked_body_over_body_limit"):
        status, raws = REJECTED[cls]
        assert_refused(live, raws[0], status)
    lines = live.errors().splitlines()
    assert len(lines) == 3, lines
    assert all(line.startswith("INFO refused request from 127.0.0.1: ") for line in lines)
    assert "Traceback" not in live.errors() + live.stderr()


@e2e
def test_expect_100_continue_gets_continue_then_response(server):
    with server.connect() as sock:
        sock.sendall(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n")
        reader = Reader(sock)
        assert read_response(sock, reader, head_request=True).status == 100
        sock.sendall(b"hello")
        assert read_response(sock, reader).body == b"hello"


@e2e
@pytest.mark.parametrize("raw", [
    post(["Content-Length: 10"], b"abc"),
    chunked(b"5\r\nhel", trailer=b""),
    chunked(b"5\r\nhello\r\n", trailer=b""),
])
def test_request_body_cut_short_closes_quietly(fresh_server, raw):
    live = fresh_server()
    with live.connect() as sock:
        sock.sendall(raw)
        sock.shutdown(socket.SHUT_WR)
        assert read_response(sock) is None
    assert live.get("/").status == 200
    assert "Traceback" not in live.stderr() + live.errors()


# --- e2e: fuzzing --------------------------------------------------------------

SEEDS = GOOD + [raw for _, raws in REJECTED.values() for raw in raws if len(raw) < 700]
INTERESTING = [b"\r", b"\n", b"\r\n", b"\x00", b" ", b"\t", b":", b";", b",", b"0", b"f",
               b"\x7f", b"\xff", b'"', b"chunked", b"Content-Length: 3\r\n",
               b"Transfer-Encoding: chunked\r\n", b"HTTP/1.1", b"\r\n\r\n"]


@st.composite
def mutated_requests(draw):
    raw = bytearray(draw(st.sampled_from(SEEDS)))
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(raw)))
        op = draw(st.sampled_from(["insert", "delete", "replace", "repeat", "truncate"]))
        if op == "insert":
            raw[at:at] = draw(st.sampled_from(INTERESTING) | st.binary(min_size=1, max_size=8))
        elif op == "delete":
            del raw[at:at + draw(st.integers(1, 8))]
        elif op == "replace" and at < len(raw):
            raw[at] = draw(st.sampled_from(INTERESTING))[0]
        elif op == "repeat":
            raw[at:at] = raw[at:at + draw(st.integers(1, 40))]
        elif op == "truncate":
            del raw[at:]
    return bytes(raw)


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory):
    live = LiveServer(tmp_path_factory.mktemp("fuzz"), **LIMITS)
    yield live
    live.stop()
    assert "Traceback" not in live.stderr() + live.errors()
    assert "ResourceWarning" not in live.stderr()


@e2e
@settings(max_examples=200, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(raw=st.one_of(mutated_requests(), st.binary(max_size=300)))
def test_fuzzed_requests_get_4xx_or_close_never_5xx_or_a_hang(fuzz_server, raw):
    with fuzz_server.connect() as sock:
        try:
            sock.sendall(raw)
            sock.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server refused and closed before reading it all
        reader = Reader(sock)
        deadline = time.monotonic() + 5
        try:
            while reader.fill():
                assert time.monotonic() < deadline, "server kept the connection open"
        except ConnectionResetError:
            pass
        except TimeoutError:
            pytest.fail(f"server hung on {raw!r}")
    statuses = [int(s) for s in re.findall(rb"(?:^|\r\n)HTTP/1\.1 (\d{3}) ", reader.buf)]
    # 501 (unknown transfer coding) and 505 (HTTP/2+) are deliberate refusals.
    assert all(s < 500 or s in (501, 505) for s in statuses), (raw, reader.buf[:300])
    assert fuzz_server.get("/").status == 200


# --- e2e: slow clients -----------------------------------------------------------


@e2e
def test_slow_header_senders_are_cut_after_header_timeout_while_others_are_served(fresh_server):
    live = fresh_server(worker_connections=10, header_timeout=1.0)
    started = time.monotonic()
    slow = [live.connect() for _ in range(8)]
    for sock in slow:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: t\r\nX-Slow: ")
        sock.setblocking(False)
    cut = {}
    served = 0
    while len(cut) < len(slow) and time.monotonic() - started < 4:
        for i, sock in enumerate(slow):
            if i in cut:
                continue
            try:
                sock.send(b"a")
                data = sock.recv(4096)
            except (BlockingIOError, InterruptedError):
                continue
            except (BrokenPipeError, ConnectionResetError):
                data = b""
            assert data == b"" or data.startswith(b"HTTP/1.1 408 "), data
            cut[i] = time.monotonic() - started
        assert live.get("/").status == 200  # two slots are still free
        served += 1
        time.sleep(0.1)
    for sock in slow:
        sock.close()
    assert len(cut) == len(slow), f"only {len(cut)} slow connections were cut"
    assert all(0.8 < seconds < 2.5 for seconds in cut.values()), cut
    assert served >= 5
    # and their slots are free again
    socks = [live.connect() for _ in range(10)]
    for sock in socks:
        sock.sendall(request())
    assert all(read_response(sock).status == 200 for sock in socks)
    for sock in socks:
        sock.close()


@e2e
def test_silent_connection_is_closed_quietly_after_header_timeout(server):
    with server.connect() as sock:
        seconds = wait_closed(sock, 4)
    assert seconds is not None and 0.8 < seconds < 2.5, seconds


@e2e
def test_partial_request_head_gets_408_after_header_timeout(server):
    with server.connect() as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: t\r\n")
        sock.settimeout(4)
        reply = read_response(sock)
        assert reply.status == 408
        assert is_closed(sock)


@e2e
def test_a_kept_connections_next_head_cut_midway_gets_408_after_header_timeout(fresh_server):
    # Its first bytes end the keep-alive wait: from then on the head is under
    # header_timeout (1 s), not the idle keep_alive (10 s), and is answered.
    live = fresh_server(header_timeout=1.0, keep_alive=10.0)
    with live.connect() as sock:
        reader = Reader(sock)
        sock.sendall(request())
        assert read_response(sock, reader).status == 200
        sock.sendall(b"GET / HTTP/1.1\r\nHost: t\r\n")
        sock.settimeout(4)
        started = time.monotonic()
        assert read_response(sock, reader).status == 408
        assert time.monotonic() - started < 3
        assert is_closed(sock)


@e2e
def test_idle_keep_alive_connection_is_closed_after_keep_alive(server):
    with server.connect() as sock:
        sock.sendall(request())
        assert read_response(sock).status == 200
        seconds = wait_closed(sock, 4)
    assert seconds is not None and 0.7 < seconds < 2.5, seconds


@e2e
def test_timers_restart_for_every_request_on_a_keep_alive_connection(server):
    # Each gap is under the 1 s limits, their sums are over them.
    with server.connect() as sock:
        reader = Reader(sock)
        for _ in range(4):
            time.sleep(0.3)  # idle: keep_alive
            sock.sendall(b"GET / HTTP/1.1\r\n")
            time.sleep(0.3)  # mid-head: header_timeout
            sock.sendall(b"Host: t\r\n\r\n")
            assert read_response(sock, reader).status == 200


# --- e2e: application errors and response framing ----------------------------------


@e2e
def test_app_exception_gets_500_with_logged_traceback_and_next_request_is_served(fresh_server):
    live = fresh_server()
    reply, closed = live.exchange(request("GET /boom HTTP/1.1"))
    assert (reply.status, reply.body, closed) == (500, b"Internal Server Error", True)
    assert "boom" not in reply.body.decode()
    errors = live.errors()
    assert "ERROR error handling GET /boom HTTP/1.1 from 127.0.0.1\nTraceback" in errors
    assert "RuntimeError: boom from the test app" in errors
    assert live.get("/").status == 200


@e2e
def test_app_exception_after_headers_closes_connection_and_logs_traceback(fresh_server):
    live = fresh_server()
    with live.connect() as sock:
        sock.sendall(request("GET /boom-late HTTP/1.1"))
        reply = read_response(sock)
        assert reply.status == 200 and not reply.complete and reply.body == b"partial"
    assert "RuntimeError: boom after the headers went out" in live.errors()
    assert live.get("/").status == 200


@e2e
@pytest.mark.parametrize("path, framing", [("/generator", ("transfer-encoding", "chunked")),
                                           ("/echo", ("content-length", "0"))])
def test_head_response_carries_the_get_headers_but_no_body(server, path, framing):
    with server.connect() as sock:
        sock.sendall(request(f"HEAD {path} HTTP/1.1") + request())
        reader = Reader(sock)
        head = read_response(sock, reader, head_request=True)
        assert head.status == 200 and head.headers[framing[0]] == framing[1]
        assert read_response(sock, reader).body == b"ok"  # framing intact


@e2e
def test_unframed_http10_response_closes_the_connection(server):
    reply, closed = server.exchange(request("GET /generator HTTP/1.0", ("Connection: keep-alive",)))
    assert reply.body == b"generated" and reply.headers["connection"] == "close" and closed


@e2e
def test_response_shorter_than_its_content_length_closes_the_connection(server):
    reply, closed = server.exchange(request("GET /short HTTP/1.1"))
    assert not reply.complete and closed


@e2e
def test_unread_request_body_is_skipped_and_connection_kept(server):
    with server.connect() as sock:
        sock.sendall(post(["Content-Length: 5"], b"hello").replace(b"/echo", b"/") + request())
        reader = Reader(sock)
        assert read_response(sock, reader).body == b"ok"
        assert read_response(sock, reader).body == b"ok"


# --- e2e: access log ---------------------------------------------------------------


@e2e
def test_access_log_escapes_client_text_and_never_logs_credentials(fresh_server):
    live = fresh_server()
    headers = (
        "Host: t",
        'User-Agent: evil" 200 "x\t\\ \xff',
        'Referer: http://r/"',
        "Authorization: Bearer AUTH-SECRET",
        "Cookie: session=COOKIE-SECRET",
        "Proxy-Authorization: Basic PROXY-SECRET",
        "Connection: close",
    )
    assert live.exchange(request('GET /a"b\\c?q=" HTTP/1.1', headers))[0].status == 200
    assert live.exchange(request("GET /boom HTTP/1.1", headers))[0].status == 500
    line = live.access().splitlines()[0]
    assert re.fullmatch(
        r'INFO 127\.0\.0\.1 - - \[\d\d/\w{3}/\d{4}:\d\d:\d\d:\d\d [+-]\d{4}\] '
        r'"GET /a\\"b\\\\c\?q=\\" HTTP/1\.1" 200 2 '
        r'"http://r/\\"" "evil\\" 200 \\"x\\x09\\\\ \\xff"', line), line
    everything = live.access() + live.errors() + live.stderr()
    for secret in ("AUTH-SECRET", "COOKIE-SECRET", "PROXY-SECRET"):
        assert secret not in everything


def test_access_log_time_of_a_keep_alive_request_leaves_out_the_idle_wait_before_it():
    """The request time given to the access log (%(D)s, %(T)s, %(L)s) starts
    when the request's bytes arrive, not when the connection began to wait
    for them: a client that idles between requests does not make them slow."""
    import logging
    from wsgiref.validate import validator

    import gevent
    from gevent import socket as gsocket

    from forkserve.http.server import Server

    idle = 1.0
    logged = []

    def sink(environ, line, status, headers, sent, started):
        logged.append(time.perf_counter() - started)

    def app(environ, start_response):
        start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", "2")])
        return [b"ok"]

    listener = gsocket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    server = Server(listener, validator(app), access_log=logging.getLogger("test.idle"),
                    access_sink=sink)
    server.start()
    client = gsocket.create_connection(listener.getsockname())
    try:
        for n in range(2):
            if n:
                gevent.sleep(idle)  # the client idles on its keep-alive connection
            client.sendall(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
            received = b""
            while not received.endswith(b"\r\n\r\nok"):
                data = client.recv(4096)
                assert data, received
                received += data
            deadline = time.monotonic() + 10
            while len(logged) <= n and time.monotonic() < deadline:
                gevent.sleep(0.01)
    finally:
        client.close()
        server.stop_accepting()
        server.close_now()
    assert len(logged) == 2, logged
    assert logged[1] < idle / 2, logged


# --- e2e: the WSGI contract (PEP 3333) --------------------------------------------


@e2e
@pytest.mark.parametrize("path", ["/twice", "/twice?swallow=1"])
def test_second_start_response_without_exc_info_gets_500_and_a_logged_error(fresh_server, path):
    live = fresh_server()
    reply, closed = live.exchange(request(f"GET {path} HTTP/1.1"))
    assert (reply.status, closed) == (500, True)
    assert "start_response() called a second time without exc_info" in live.errors()
    assert live.get("/").status == 200


@e2e
def test_start_response_with_exc_info_replaces_headers_not_yet_sent(server):
    reply = server.get("/replace")
    assert (reply.status, reply.body) == (503, b"replaced")


@e2e
def test_start_response_with_exc_info_after_headers_sent_reraises_and_cuts_the_response(
        fresh_server):
    live = fresh_server()
    with live.connect() as sock:
        sock.sendall(request("GET /late-exc-info HTTP/1.1"))
        reply = read_response(sock)
        assert (reply.status, reply.body, reply.complete) == (200, b"first", False)
    assert "ValueError: late error" in live.errors()


@e2e
def test_write_callable_output_precedes_the_returned_body(server):
    reply = server.get("/write")
    assert (reply.status, reply.body) == (200, b"written and returned")
    assert reply.headers["transfer-encoding"] == "chunked"


@e2e
@pytest.mark.parametrize("name, value", [
    ("X-Bad", "a\r\nInjected: yes"), ("X-Bad", "a\x00"), ("X Bad", "v"), ("X:Bad", "v"),
    ("", "v"), ("X-Bad", "\u20ac"),
])
def test_invalid_response_header_from_the_app_gets_500_never_reaches_the_wire(
        fresh_server, name, value):
    from urllib.parse import quote
    live = fresh_server()
    reply = live.get(f"/header?name={quote(name)}&value={quote(value)}")
    assert reply.status == 500 and "injected" not in reply.headers
    assert "invalid response header" in live.errors() or "latin-1" in live.errors()


@e2e
@pytest.mark.parametrize("status", ["204 No Content", "304 Not Modified"])
def test_204_and_304_responses_carry_no_body_and_keep_the_connection(server, status):
    from urllib.parse import quote
    with server.connect() as sock:
        sock.sendall(request(f"GET /status?status={quote(status)} HTTP/1.1") + request())
        reader = Reader(sock)
        reply = read_response(sock, reader)
        assert reply.status == int(status[:3]) and "transfer-encoding" not in reply.headers
        assert ("content-length" in reply.headers) == (status.startswith("304"))
        assert read_response(sock, reader).body == b"ok"  # no body bytes in between


@e2e
def test_file_wrapper_sends_the_file_and_keeps_the_connection(server, tmp_path):
    from urllib.parse import quote
    data = bytes(range(256)) * 1000
    path = tmp_path / "blob"
    path.write_bytes(data)
    with server.connect() as sock:
        reader = Reader(sock)
        for method in ("GET", "HEAD", "GET"):
            sock.sendall(request(f"{method} /file?path={quote(str(path))} HTTP/1.1"))
            reply = read_response(sock, reader, head_request=method == "HEAD")
            assert reply.status == 200 and reply.headers["content-length"] == str(len(data))
            assert reply.body == (data if method == "GET" else b"")
        sock.sendall(request())
        assert read_response(sock, reader).body == b"ok"


@e2e
def test_environ_carries_raw_uri_request_uri_and_absolute_form_host(server):
    import json
    reply = server.get("/environ/%41b?x=%20")
    env = json.loads(reply.body)
    assert (env["PATH_INFO"], env["QUERY_STRING"]) == ("/environ/Ab", "x=%20")
    with server.connect() as sock:
        sock.sendall(request("GET http://other.example:8080/environ?q HTTP/1.1"))
        env = json.loads(read_response(sock).body)
    assert (env["HTTP_HOST"], env["PATH_INFO"], env["QUERY_STRING"]) == (
        "other.example:8080", "/environ", "q")


@e2e
def test_options_asterisk_reaches_the_app_with_path_info_asterisk(server):
    reply = server.exchange(request("OPTIONS * HTTP/1.1"))[0]
    assert (reply.status, reply.body) == (200, b"ok")


# --- e2e: slow request bodies and clients that do not read --------------------------


def slots_freed_in_time(live, timeout):
    """Connect a new client while held connections take every slot; return
    (seconds until it was answered, seconds until the server held no other
    connection: its /counters request is then the only one open)."""
    started = time.monotonic()
    with live.connect(timeout=timeout + 5) as newcomer:
        newcomer.sendall(request())
        assert read_response(newcomer).status == 200
        answered = time.monotonic() - started
    deadline = started + timeout + 5
    while json.loads(live.get("/counters").body)["open"] > 1:
        assert time.monotonic() < deadline, "held connections still open"
        time.sleep(0.05)
    return round(answered, 2), round(time.monotonic() - started, 2)


@e2e
def test_stalled_request_bodies_are_cut_after_body_timeout_and_a_new_client_gets_a_slot(
        fresh_server):
    live = fresh_server(worker_connections=4, body_timeout=1.0)
    stalled = hold_every_slot(
        live, 4, lambda sock: sock.sendall(post(["Content-Length: 100"], b"only ten b")))
    answered, freed = slots_freed_in_time(live, 1.0)
    print(f"\nstalled bodies: new client answered after {answered}s, all slots free after {freed}s")
    assert 0.8 < answered < 3.0 and freed < 3.0, (answered, freed)
    for sock in stalled:
        assert read_response(sock).status == 408
    for sock in stalled:
        sock.close()
    assert live.errors().count("408 request body not received within 1 s") == 4


@e2e
def test_stalled_body_that_trickles_is_cut_at_the_total_body_timeout(fresh_server):
    live = fresh_server(body_timeout=1.0)
    with live.connect() as sock:
        sock.sendall(post(["Content-Length: 100"], b""))
        started = time.monotonic()
        cut = None
        for _ in range(30):  # one byte every 0.2 s: each wait is short, the total is not
            try:
                sock.sendall(b"x")
            except (BrokenPipeError, ConnectionResetError):
                cut = time.monotonic() - started
                break
            time.sleep(0.2)
            sock.setblocking(False)
            try:
                if sock.recv(65536).startswith(b"HTTP/1.1 408 "):
                    cut = time.monotonic() - started
                    break
            except BlockingIOError:
                pass
            finally:
                sock.setblocking(True)
    assert cut is not None and 0.8 < cut < 2.5, cut


@e2e
def test_clients_that_do_not_read_are_cut_after_send_timeout_and_never_block_others(fresh_server):
    live = fresh_server(worker_connections=5, send_timeout=1.0)

    def request_and_never_read(sock):
        sock.sendall(request("GET /big HTTP/1.1"))  # 64 MiB: far more than socket buffers
    deaf = hold_every_slot(live, 4, request_and_never_read)
    # the fifth slot serves other clients at once while four sends are stuck
    for _ in range(5):
        started = time.monotonic()
        assert live.get("/").status == 200
        assert time.monotonic() - started < 0.5
    deaf.append(live.connect())
    request_and_never_read(deaf[-1])
    answered, freed = slots_freed_in_time(live, 1.0)
    print(f"\nnon-reading clients: new client answered after {answered}s, "
          f"all slots free after {freed}s")
    assert 0.8 < answered < 3.0 and freed < 3.0, (answered, freed)
    for sock in deaf:
        sock.close()
    # their slots are free again
    socks = [live.connect() for _ in range(5)]
    for sock in socks:
        sock.sendall(request())
    assert all(read_response(sock).status == 200 for sock in socks)
    for sock in socks:
        sock.close()


def hold_every_slot(live, slots, send):
    """Open `slots` connections and call send(sock) on each; return them once
    the server holds all of them (checked through the last free slot before
    the last one is taken)."""
    held = [live.connect() for _ in range(slots - 1)]
    for sock in held:
        send(sock)
    deadline = time.monotonic() + 5
    while json.loads(live.get("/counters").body)["open"] < slots:  # the held + this request
        assert time.monotonic() < deadline, "the server did not take the held connections"
        time.sleep(0.05)
    held.append(live.connect())
    send(held[-1])
    return held


# --- e2e: every response after which the server closes says so -------------------------


@e2e
def test_unhonoured_expect_100_continue_gets_connection_close(server):
    raw = b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n"
    reply, closed = server.exchange(raw)  # the app never reads: no 100 Continue is sent
    assert (reply.status, reply.headers["connection"], closed) == (200, "close", True)


@e2e
def test_unread_body_not_yet_received_gets_connection_close(fresh_server):
    live = fresh_server(limit_request_body=0)
    with live.connect() as sock:
        sock.sendall(b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 100000\r\n\r\n" + b"x" * 1000)
        reply = read_response(sock)
        assert (reply.status, reply.headers["connection"]) == (200, "close")


def test_a_small_body_still_arriving_when_the_head_goes_out_is_read_whole():
    """The response head goes out (start_response, then write()) while part
    of a small Content-Length body is still on its way: the server's look at
    what already arrived must not take "nothing yet" for the client's close,
    so the application reads the whole body once the rest comes."""
    from wsgiref.validate import validator

    import gevent
    from gevent import socket as gsocket

    from forkserve.http.server import Server

    read = []
    head_sent = gevent.event.Event()

    def app(environ, start_response):
        write = start_response("200 OK", [("Content-Type", "text/plain")])
        write(b"head ")  # the head goes out before the body is read
        head_sent.set()
        read.append(environ["wsgi.input"].read(10))
        return [b"got " + read[-1]]

    listener = gsocket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    server = Server(listener, validator(app))
    server.start()
    client = gsocket.create_connection(listener.getsockname())
    try:
        client.sendall(b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\n01234")
        assert head_sent.wait(10), "the application never sent its head"
        client.sendall(b"56789")
        received = b""
        with gevent.Timeout(10, AssertionError(f"no whole answer: {received!r}")):
            while b"got 0123456789" not in received:
                data = client.recv(4096)
                assert data, received
                received += data
        assert read == [b"0123456789"]
    finally:
        client.close()
        server.stop_accepting()
        server.close_now()


def test_the_fixed_field_table_keys_a_name_as_the_general_rule_does():
    """A field name found in the table skips the rule (HTTP_, upper case, "-"
    as "_", names with "_" dropped), so each entry must agree with it."""
    from forkserve.http.h1 import TCHAR
    from forkserve.http.protocol import _FIELD_KEYS
    for name, key in _FIELD_KEYS.items():
        assert "_" not in name and re.fullmatch(f"[{TCHAR}]+", name)
        assert key == "HTTP_" + name.upper().replace("-", "_")
    connection = Connection(Limits())
    connection.receive_data(b"GET / HTTP/1.1\r\nhOsT: a\r\nuser-AGENT: b\r\nX-Odd-One: c\r\n"
                            b"Content-type: d\r\n\r\n")
    assert connection.next_event().headers == {
        "HTTP_HOST": "a", "HTTP_USER_AGENT": "b", "HTTP_X_ODD_ONE": "c", "CONTENT_TYPE": "d"}


def test_a_closed_descriptor_is_an_error_of_ours_not_a_client_gone():
    # Issue 33 item 6: EBADF was counted with the errnos of a client going away.
    import errno
    import gevent.socket
    from forkserve.http.transport import Transport
    ours, theirs = gevent.socket.socketpair()
    transport = Transport(ours, gevent.get_hub().loop, 5)
    theirs.close()
    with pytest.raises(ClientDisconnected):  # the client is gone: EPIPE
        transport.send(b"x" * 100)
    transport.close()
    ours2, theirs2 = gevent.socket.socketpair()
    transport = Transport(ours2, gevent.get_hub().loop, 5)
    os.close(ours2.detach())  # closed under the connection: a bug, raised as such
    with pytest.raises(OSError) as raised:
        transport.send(b"x")
    assert raised.value.errno == errno.EBADF and not isinstance(raised.value, ClientDisconnected)
    theirs2.close()
    transport.reader.close()
