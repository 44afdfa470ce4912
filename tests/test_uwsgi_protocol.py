"""forkserve.http.uwsgi on plain bytes: a corpus of good and bad uwsgi
packets, as nginx's uwsgi_pass (with include uwsgi_params) sends them, with
no socket. The environ must be the one the HTTP side builds."""

import struct
from urllib.parse import unquote

import pytest

from forkserve.http.body import Body
from forkserve.http.environ import request_environ
from forkserve.http.h1 import Limits, RequestError
from forkserve.http.protocol import DONE, END, NEED_DATA, PEER_CLOSED, Connection, Data, Request
from forkserve.http.uwsgi import UwsgiConnection, encode_packet, parse_vars

BASE = {"SCRIPT_NAME": "", "wsgi.url_scheme": "http", "REMOTE_ADDR": "127.0.0.1",
        "SERVER_NAME": "127.0.0.1", "SERVER_PORT": "3031"}


def nginx_vars(method="GET", uri="/", body=b"", **extra):
    """The vars nginx's stock uwsgi_params gives for a request (its order)."""
    path, _, query = uri.partition("?")
    pairs = [("QUERY_STRING", query), ("REQUEST_METHOD", method), ("CONTENT_TYPE", ""),
             ("CONTENT_LENGTH", str(len(body)) if body else ""), ("REQUEST_URI", uri),
             ("PATH_INFO", unquote(path, "latin-1")),  # $document_uri: decoded
             ("DOCUMENT_ROOT", "/usr/share/nginx/html"),
             ("SERVER_PROTOCOL", "HTTP/1.1"), ("REQUEST_SCHEME", "http"),
             ("REMOTE_ADDR", "203.0.113.9"), ("REMOTE_PORT", "51234"), ("SERVER_PORT", "80"),
             ("SERVER_NAME", "example.com"), ("HTTP_HOST", "example.com"),
             ("HTTP_USER_AGENT", "curl/8.5.0"), ("HTTP_ACCEPT", "*/*")]
    pairs += list(extra.items())
    return pairs


def feed(data, limits=None, step=None):
    """All events of `data` fed whole (or `step` bytes at a time), then EOF."""
    connection = UwsgiConnection(limits or Limits())
    events = []
    chunks = [data] if step is None else [data[i:i + step] for i in range(0, len(data), step)]
    for chunk in chunks + [b""]:
        connection.receive_data(chunk)
        while True:
            event = connection.next_event()
            if event is NEED_DATA or event is PEER_CLOSED:
                break
            events.append(event)
            if event is END or isinstance(event, Request) and connection.their_state is DONE:
                return connection, events
        if event is PEER_CLOSED:
            events.append(event)
            break
    return connection, events


def refused(data, limits=None):
    with pytest.raises(RequestError) as caught:
        feed(data, limits)
    return caught.value.status, caught.value.reason


# --- good packets -------------------------------------------------------------------

def test_nginx_get_becomes_the_environ_the_http_side_builds():
    connection, (request,) = feed(encode_packet(nginx_vars(uri="/a%20b/c?x=1&y=2")))
    env = request_environ(BASE, request)
    http = Connection(Limits())
    http.receive_data(b"GET /a%20b/c?x=1&y=2 HTTP/1.1\r\nHost: example.com\r\n"
                      b"User-Agent: curl/8.5.0\r\nAccept: */*\r\n\r\n")
    http_env = request_environ(BASE, http.next_event())
    assert env["PATH_INFO"] == "/a b/c" == http_env["PATH_INFO"]
    for key in ("REQUEST_METHOD", "QUERY_STRING", "REQUEST_URI", "RAW_URI", "SERVER_PROTOCOL",
                "HTTP_HOST", "HTTP_USER_AGENT", "HTTP_ACCEPT", "SCRIPT_NAME"):
        assert env[key] == http_env[key], key
    # what nginx knows of the client, which the HTTP side would learn from the socket
    assert (env["REMOTE_ADDR"], env["REMOTE_PORT"]) == ("203.0.113.9", "51234")
    assert (env["SERVER_NAME"], env["SERVER_PORT"]) == ("example.com", "80")
    assert env["DOCUMENT_ROOT"] == "/usr/share/nginx/html" and env["REQUEST_SCHEME"] == "http"
    assert env["wsgi.url_scheme"] == "http" and "CONTENT_LENGTH" not in env
    assert request.line == "GET /a%20b/c?x=1&y=2 HTTP/1.1"
    assert connection.their_state is DONE and not connection.keep_alive


def test_path_info_is_nginx_s_decoded_rewritten_path_not_the_uri_again():
    pairs = [(k, v) for k, v in nginx_vars(uri="/old/100%25") if k != "PATH_INFO"]
    _, (request,) = feed(encode_packet(pairs + [("PATH_INFO", "/new/100%")]))
    env = request_environ(BASE, request)
    assert env["PATH_INFO"] == "/new/100%"  # not unquoted a second time
    assert env["REQUEST_URI"] == "/old/100%25"


def test_only_request_uri_is_split_and_decoded_like_an_http_target():
    _, (request,) = feed(encode_packet([("REQUEST_METHOD", "GET"),
                                        ("REQUEST_URI", "/x%2Fy?q=%41")]))
    env = request_environ(BASE, request)
    assert (env["PATH_INFO"], env["QUERY_STRING"]) == ("/x/y", "q=%41")
    assert env["SERVER_PROTOCOL"] == "HTTP/1.0"


@pytest.mark.parametrize("step", [None, 1, 3, 7])
def test_post_body_follows_the_packet_in_any_split(step):
    body = b"name=forkserve&" * 100
    packet = encode_packet(nginx_vars("POST", "/form", body,
                                      CONTENT_TYPE="application/x-www-form-urlencoded"))
    connection, events = feed(packet + body, step=step)
    request = events[0]
    assert request.length == len(body) and not request.chunked
    assert b"".join(e.data for e in events if isinstance(e, Data)) == body
    assert events[-1] is END
    env = request_environ(BASE, request)
    assert env["CONTENT_LENGTH"] == str(len(body))
    assert env["CONTENT_TYPE"] == "application/x-www-form-urlencoded"


def test_content_length_zero_stays_in_the_environ_as_on_the_http_side():
    _, (request,) = feed(encode_packet(nginx_vars("PUT", "/", CONTENT_LENGTH="0")))
    assert request_environ(BASE, request)["CONTENT_LENGTH"] == "0" and request.length == 0


def test_body_is_read_through_wsgi_input_and_nothing_after_it_is_parsed():
    body = b'{"a": 1}'
    smuggled = encode_packet(nginx_vars(uri="/admin"))
    connection = UwsgiConnection(Limits())
    connection.receive_data(encode_packet(nginx_vars("POST", "/", body)) + body + smuggled)
    request = connection.next_event()
    assert Body(connection, lambda: None).read() == body
    head = connection.response_head("200 OK", [("Content-Length", "2")], b"ok", None, "d")
    assert b"Connection: close\r\n" in head
    assert connection.response_end() == b""
    assert connection.start_next_cycle() is False  # the bytes after the body are never a request
    assert request.target == "/"


def test_repeated_headers_join_as_on_the_http_side_and_framing_ones_are_dropped():
    pairs = nginx_vars() + [("HTTP_COOKIE", "a=1"), ("HTTP_COOKIE", "b=2"),
                            ("HTTP_X_TAG", "1"), ("HTTP_X_TAG", "2"),
                            ("HTTP_CONTENT_LENGTH", "99"), ("HTTP_TRANSFER_ENCODING", "chunked")]
    _, (request,) = feed(encode_packet(pairs))
    env = request_environ(BASE, request)
    assert env["HTTP_COOKIE"] == "a=1; b=2" and env["HTTP_X_TAG"] == "1,2"
    assert "HTTP_CONTENT_LENGTH" not in env and "HTTP_TRANSFER_ENCODING" not in env
    assert request.length == 0


@pytest.mark.parametrize("extra, scheme", [
    ({}, "http"), ({"HTTPS": "on"}, "https"), ({"HTTPS": "1"}, "https"),
    ({"HTTPS": "off"}, "http"), ({"UWSGI_SCHEME": "https"}, "https"),
    ({"HTTPS": "on", "UWSGI_SCHEME": "http"}, "http")])
def test_url_scheme_from_uwsgi_scheme_else_https_as_uwsgi_reads_them(extra, scheme):
    _, (request,) = feed(encode_packet(nginx_vars(**extra)))
    assert request_environ(BASE, request)["wsgi.url_scheme"] == scheme


def test_response_of_unknown_length_is_not_chunked_and_ends_with_the_close():
    connection, _ = feed(encode_packet(nginx_vars()))
    head = connection.response_head("200 OK", [("Content-Type", "text/plain")], b"hi", None, "d")
    assert head.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"Transfer-Encoding" not in head and b"Connection: close\r\n" in head
    assert head.endswith(b"\r\n\r\nhi")
    assert connection.response_data(b"more") == b"more"
    assert connection.response_end() == b"" and not connection.start_next_cycle()


def test_expect_100_continue_is_never_answered_nginx_did():
    body = b"x" * 10
    connection = UwsgiConnection(Limits())
    connection.receive_data(encode_packet(nginx_vars("PUT", "/", body,
                                                     HTTP_EXPECT="100-continue")))
    connection.next_event()
    assert not connection.continue_pending


def test_modifier1_30_of_old_nginx_sites_is_wsgi_with_script_name_stripped():
    pairs = [(k, v) for k, v in nginx_vars(uri="/app/page") if k != "PATH_INFO"]
    _, (request,) = feed(encode_packet(pairs + [("SCRIPT_NAME", "/app"),
                                                ("PATH_INFO", "/app/page")], modifier1=30))
    env = request_environ(BASE, request)
    assert (env["SCRIPT_NAME"], env["PATH_INFO"]) == ("/app", "/page")


def test_peer_closing_before_a_packet_is_a_clean_close_and_mid_packet_abandons():
    assert feed(b"")[1] == [PEER_CLOSED]
    assert feed(encode_packet(nginx_vars())[:9])[1] == [PEER_CLOSED]


# --- bad packets --------------------------------------------------------------------

def _raw(modifier1, size, modifier2, data):
    return struct.pack("<BHB", modifier1, size, modifier2) + data


BAD = [
    ("http sent to a uwsgi listener", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", 400, "looks like HTTP"),
    ("modifier1 not WSGI", encode_packet(nginx_vars(), modifier1=5), 400, "modifier1 5"),
    ("modifier2 set", encode_packet(nginx_vars(), modifier2=1), 400, "modifier2 1"),
    ("key length past the end", _raw(0, 4, 0, b"\x09\x00ABCD"), 400, "past the datasize"),
    ("value length past the end", _raw(0, 8, 0, b"\x01\x00A\xff\x00xyz"), 400,
     "runs past the datasize"),
    ("one dangling byte", _raw(0, 7, 0, b"\x01\x00A\x01\x00Bz"), 400, "past the datasize"),
    ("empty key", _raw(0, 4, 0, b"\x00\x00\x00\x00"), 400, "empty key"),
    ("key not a CGI name", encode_packet(nginx_vars() + [("HTTP X", "1")]), 400, "CGI name"),
    ("CR LF in a value", encode_packet(nginx_vars(HTTP_X_A="1\r\nX-B: 2")), 400, "CR, LF"),
    ("NUL in a value", encode_packet(nginx_vars(HTTP_X_A="1\x002")), 400, "CR, LF or NUL"),
    ("no method", encode_packet([("REQUEST_URI", "/")]), 400, "REQUEST_METHOD"),
    ("method not a token", encode_packet([("REQUEST_METHOD", "G T"), ("REQUEST_URI", "/")]),
     400, "REQUEST_METHOD"),
    ("bad protocol", encode_packet(nginx_vars(SERVER_PROTOCOL="HTTP/x")), 400, "SERVER_PROTOCOL"),
    ("no uri", encode_packet([("REQUEST_METHOD", "GET")]), 400, "neither"),
    ("content length not digits", encode_packet(nginx_vars(CONTENT_LENGTH="-1")), 400,
     "Content-Length"),
    ("content length with a sign", encode_packet(nginx_vars(CONTENT_LENGTH="+5")), 400,
     "Content-Length"),
    ("two content lengths", encode_packet(nginx_vars() + [("CONTENT_LENGTH", "1"),
                                                          ("CONTENT_LENGTH", "2")]), 400,
     "more than one"),
    ("two hosts", encode_packet(nginx_vars() + [("HTTP_HOST", "evil")]), 400, "Host"),
    ("invalid host", encode_packet(nginx_vars(HTTP_HOST="a b")), 400, "Host"),
    ("bad scheme", encode_packet(nginx_vars(UWSGI_SCHEME="gopher")), 400, "UWSGI_SCHEME"),
]


@pytest.mark.parametrize("data, status, reason", [case[1:] for case in BAD],
                         ids=[case[0] for case in BAD])
def test_malformed_packets_are_refused_with_a_reason(data, status, reason):
    got_status, got_reason = refused(data)
    assert got_status == status and reason in got_reason, got_reason


def test_limits_are_the_http_side_s():
    limits = Limits(limit_request_line=100, limit_request_fields=3,
                    limit_request_field_size=64, limit_request_body=10)
    assert refused(encode_packet(nginx_vars(uri="/" + "a" * 100)), limits)[0] == 414
    assert refused(encode_packet(nginx_vars(HTTP_X_A="1")), limits)[0] == 431  # 4 headers
    few = [(k, v) for k, v in nginx_vars() if k not in ("HTTP_ACCEPT", "HTTP_USER_AGENT")]
    assert refused(encode_packet(few + [("HTTP_X_BIG", "v" * 60)]), limits)[0] == 431
    assert refused(encode_packet(few + [("DOCUMENT_ROOT", "d" * 70)]), limits)[0] == 431
    assert refused(encode_packet(nginx_vars("POST", "/", b"x" * 11)), limits)[0] == 413
    feed(encode_packet(few + [("HTTP_X_BIG", "v" * 50)]), limits)  # 5+1+50+2 fits in 64


@pytest.mark.parametrize("key", ["HTTP_" + "N" * 10000, "N" * 10000])
def test_a_long_var_name_is_refused_as_a_long_header_name_is(key):
    http = Connection(Limits())
    http.receive_data(b"GET / HTTP/1.1\r\nHost: h\r\n" + b"N" * 10000 + b": v\r\n\r\n")
    with pytest.raises(RequestError) as header_refused:
        http.next_event()
    status, reason = refused(encode_packet(nginx_vars() + [(key, "v")]))
    assert status == header_refused.value.status == 431
    assert "over 8190 bytes" in reason and len(reason) < 100  # the name cut in the reason
    few = [(k, v) for k, v in nginx_vars() if k != "DOCUMENT_ROOT"]
    limits = Limits(limit_request_field_size=64)
    feed(encode_packet(few + [("X" * 52, "v" * 8)]), limits)  # 52+2+8+2 fits in 64
    assert refused(encode_packet(few + [("X" * 53, "v" * 8)]), limits)[0] == 431


def test_a_refused_connection_answers_http_and_closes():
    connection = UwsgiConnection(Limits())
    connection.receive_data(encode_packet(nginx_vars(), modifier1=7))
    with pytest.raises(RequestError):
        connection.next_event()
    assert connection.refusal(400).startswith(b"HTTP/1.1 400 Bad Request\r\n")
    with pytest.raises(RuntimeError):
        connection.next_event()  # nothing is parsed after a refusal


def test_parse_vars_reads_binary_lengths_little_endian():
    data = b"\x03\x00KEY" + b"\x00\x01" + b"v" * 256
    assert parse_vars(data) == [("KEY", "v" * 256)]
    assert parse_vars(b"") == []
