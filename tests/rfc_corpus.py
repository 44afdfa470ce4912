"""Raw HTTP/1.1 requests by RFC 9110/9112 section, each with what a strict
server must do with it: serve it (and what the application must see) or
refuse it (with which status). Written for forkserve; run against forkserve
by tests/test_rfc_corpus.py and side by side with Gunicorn by
benchmarks/http_corpus.py. The application is tests/apps/echo_environ.py.

The limit cases assume CORPUS_LIMITS (given to both servers with the same
numbers); their boundaries are where Gunicorn puts them.
"""

from dataclasses import dataclass, field

CORPUS_LIMITS = {"limit-request-line": 100, "limit-request-fields": 10,
                 "limit-request-field_size": 100}


@dataclass(frozen=True)
class Serve:
    """Answer 200; the application sees these environ values (and body)."""
    env: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Refuse:
    """Answer this status (forkserve's; any 4xx/5xx or a close counts as a
    refusal when comparing servers) and close the connection."""
    status: int


@dataclass(frozen=True)
class Case:
    section: str
    name: str
    raw: bytes
    expect: object


def req(line="GET / HTTP/1.1", *headers, body=b"", host="Host: example.com"):
    lines = [line] + ([host] if host else []) + list(headers)
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def sized(total, prefix="X-Pad: "):
    """A header line of exactly `total` bytes, its CRLF included."""
    return prefix + "a" * (total - len(prefix) - 2)


def line_of(length, method="GET", version="HTTP/1.1"):
    """A request line of exactly `length` bytes, its CRLF excluded."""
    fixed = len(method) + len(version) + 3  # two spaces and the leading "/"
    return f"{method} /{'a' * (length - fixed)} {version}"


CASES = [
    # --- RFC 9112 2.2: message parsing ---------------------------------------
    Case("9112-2.2", "one leading CRLF is ignored", b"\r\n" + req(), Serve({"PATH_INFO": "/"})),
    Case("9112-2.2", "two leading CRLFs", b"\r\n\r\n" + req(), Refuse(400)),
    Case("9112-2.2", "bare LF ends the request line", b"GET / HTTP/1.1\nHost: a\r\n\r\n", Refuse(400)),
    Case("9112-2.2", "bare LF ends a header line", b"GET / HTTP/1.1\r\nHost: a\n\r\n", Refuse(400)),
    Case("9112-2.2", "bare CR inside the request line", b"GET /\r HTTP/1.1\r\nHost: a\r\n\r\n",
         Refuse(400)),
    Case("9112-2.2", "whitespace before the first header",
         b"GET / HTTP/1.1\r\n Host: a\r\n\r\n", Refuse(400)),
    # --- RFC 9112 2.3: HTTP version -------------------------------------------
    Case("9112-2.3", "HTTP/1.0 without Host", req("GET / HTTP/1.0", host=""),
         Serve({"SERVER_PROTOCOL": "HTTP/1.0"})),
    Case("9112-2.3", "HTTP/1.1", req(), Serve({"SERVER_PROTOCOL": "HTTP/1.1"})),
    Case("9112-2.3", "higher minor version served as 1.1", req("GET / HTTP/1.9"), Serve({})),
    Case("9112-2.3", "major version 2", req("GET / HTTP/2.0"), Refuse(505)),
    Case("9112-2.3", "lower-case protocol name", req("GET / http/1.1"), Refuse(400)),
    Case("9112-2.3", "two-digit minor version", req("GET / HTTP/1.10"), Refuse(400)),
    Case("9112-2.3", "version without minor", req("GET / HTTP/1"), Refuse(400)),
    # --- RFC 9112 3: request line ----------------------------------------------
    Case("9112-3", "two spaces after the method", req("GET  / HTTP/1.1"), Refuse(400)),
    Case("9112-3", "tab as separator", req("GET\t/ HTTP/1.1"), Refuse(400)),
    Case("9112-3", "trailing space after the version", req("GET / HTTP/1.1 "), Refuse(400)),
    Case("9112-3", "missing version", b"GET /\r\nHost: a\r\n\r\n", Refuse(400)),
    Case("9112-3", "extra word", req("GET / x HTTP/1.1"), Refuse(400)),
    # --- RFC 9110 9.1 / 9112 3.1: method ----------------------------------------
    Case("9110-9.1", "extension method", req("PURGE /p HTTP/1.1"), Serve({"REQUEST_METHOD": "PURGE"})),
    Case("9110-9.1", "POST with a body", req("POST /p HTTP/1.1", "Content-Length: 3", body=b"abc"),
         Serve({"REQUEST_METHOD": "POST", "body": "abc"})),
    Case("9110-9.1", "PUT with a body", req("PUT /p HTTP/1.1", "Content-Length: 2", body=b"hi"),
         Serve({"REQUEST_METHOD": "PUT", "body": "hi"})),
    Case("9110-9.1", "DELETE", req("DELETE /p HTTP/1.1"), Serve({"REQUEST_METHOD": "DELETE"})),
    Case("9110-9.1", "PATCH", req("PATCH /p HTTP/1.1", "Content-Length: 0"),
         Serve({"REQUEST_METHOD": "PATCH"})),
    Case("9110-9.1", "method with a non-token byte", req("GE(T / HTTP/1.1"), Refuse(400)),
    Case("9110-9.1", "method with a slash", req("GE/T / HTTP/1.1"), Refuse(400)),
    Case("9110-9.1", "method with a non-ASCII byte", req("G\xc9T / HTTP/1.1"), Refuse(400)),
    Case("9110-9.1", "empty method", req(" / HTTP/1.1"), Refuse(400)),
    # --- RFC 9112 3.2: request target -------------------------------------------
    Case("9112-3.2.1", "origin-form with a query", req("GET /a/b?x=1&y=2 HTTP/1.1"),
         Serve({"PATH_INFO": "/a/b", "QUERY_STRING": "x=1&y=2", "RAW_URI": "/a/b?x=1&y=2"})),
    Case("9112-3.2.1", "percent-encoded path is decoded", req("GET /caf%C3%A9%20x HTTP/1.1"),
         Serve({"PATH_INFO": "/caf\xc3\xa9 x"})),
    Case("9112-3.2.1", "query kept encoded", req("GET /?q=%20a+b HTTP/1.1"),
         Serve({"QUERY_STRING": "q=%20a+b"})),
    Case("9112-3.2.1", "empty query", req("GET /p? HTTP/1.1"), Serve({"PATH_INFO": "/p",
                                                                     "QUERY_STRING": ""})),
    Case("9112-3.2.1", "encoded slash stays a slash in PATH_INFO", req("GET /a%2Fb HTTP/1.1"),
         Serve({"PATH_INFO": "/a/b"})),
    Case("9112-3.2.1", "fragment in the target", req("GET /p?q=1#frag HTTP/1.1"), Refuse(400)),
    Case("9112-3.2.1", "fragment right after the path", req("GET /p#f HTTP/1.1"), Refuse(400)),
    Case("9112-3.2.1", "raw non-ASCII byte in the path", req("GET /caf\xe9 HTTP/1.1"), Refuse(400)),
    Case("9112-3.2.1", "raw non-ASCII byte in the query", req("GET /?q=\xff HTTP/1.1"), Refuse(400)),
    Case("9112-3.2.1", "NUL in the target", req("GET /a\x00 HTTP/1.1"), Refuse(400)),
    Case("9112-3.2.1", "escape sequence in the target", req("GET /\x1b[1m HTTP/1.1"), Refuse(400)),
    Case("9112-3.2.1", "DEL in the target", req("GET /a\x7f HTTP/1.1"), Refuse(400)),
    Case("9112-3.2.1", "relative target", req("GET a/b HTTP/1.1"), Refuse(400)),
    Case("9112-3.2.2", "absolute-form gives HTTP_HOST", req("GET http://other.test/x?y HTTP/1.1"),
         Serve({"HTTP_HOST": "other.test", "PATH_INFO": "/x", "QUERY_STRING": "y"})),
    Case("9112-3.2.2", "absolute-form with a port and no path", req("GET http://o.test:81 HTTP/1.1"),
         Serve({"HTTP_HOST": "o.test:81", "PATH_INFO": "/"})),
    Case("9112-3.2.2", "absolute-form https", req("GET https://o.test/s HTTP/1.1"),
         Serve({"HTTP_HOST": "o.test", "PATH_INFO": "/s"})),
    Case("9112-3.2.2", "absolute-form with another scheme", req("GET ftp://o.test/ HTTP/1.1"),
         Refuse(400)),
    Case("9112-3.2.3", "CONNECT authority-form", req("CONNECT o.test:443 HTTP/1.1",
                                                    host="Host: o.test:443"), Refuse(501)),
    Case("9112-3.2.4", "OPTIONS asterisk-form", req("OPTIONS * HTTP/1.1"),
         Serve({"REQUEST_METHOD": "OPTIONS", "PATH_INFO": "*"})),
    Case("9112-3.2.4", "asterisk-form with GET", req("GET * HTTP/1.1"), Refuse(400)),
    # --- RFC 9112 3.2 / RFC 9110 7.2: Host ---------------------------------------
    Case("9110-7.2", "host with a port", req(host="Host: a.test:8080"),
         Serve({"HTTP_HOST": "a.test:8080"})),
    Case("9110-7.2", "IPv6 literal host", req(host="Host: [::1]:80"), Serve({"HTTP_HOST": "[::1]:80"})),
    Case("9110-7.2", "IPv4 host", req(host="Host: 127.0.0.1"), Serve({"HTTP_HOST": "127.0.0.1"})),
    Case("9110-7.2", "empty Host", req(host="Host:"), Serve({"HTTP_HOST": ""})),
    Case("9112-3.2", "HTTP/1.1 without Host", req(host=""), Refuse(400)),
    Case("9112-3.2", "two Host lines", req("GET / HTTP/1.1", "Host: b.test"), Refuse(400)),
    Case("9112-3.2", "two equal Host lines", req("GET / HTTP/1.1", "host: example.com"), Refuse(400)),
    Case("9112-3.2", "Host with a space", req(host="Host: a b"), Refuse(400)),
    Case("9112-3.2", "Host with a path", req(host="Host: a/b"), Refuse(400)),
    Case("9112-3.2", "Host with a bad port", req(host="Host: a:8x"), Refuse(400)),
    Case("9112-3.2", "Host with userinfo", req(host="Host: u@a"), Refuse(400)),
    # --- RFC 9112 5 / RFC 9110 5: header fields -------------------------------------
    Case("9110-5.5", "OWS around the value is trimmed", req("GET / HTTP/1.1", "X-A: \t v \t"),
         Serve({})),
    Case("9110-5.5", "obs-text in a value", req("GET / HTTP/1.1", "X-A: caf\xe9"), Serve({})),
    Case("9110-5.5", "empty value", req("GET / HTTP/1.1", "X-A:"), Serve({})),
    Case("9110-5.3", "repeated list header", req("GET / HTTP/1.1", "Accept: a/b", "Accept: c/d"),
         Serve({})),
    Case("9110-5.1", "mixed-case names", req("GET / HTTP/1.1", "cOnTeNt-TyPe: a/b"),
         Serve({"CONTENT_TYPE": "a/b"})),
    Case("9112-5.1", "space before the colon", req("GET / HTTP/1.1", "X-A : v"), Refuse(400)),
    Case("9112-5.1", "tab before the colon", req("GET / HTTP/1.1", "X-A\t: v"), Refuse(400)),
    Case("9112-5.1", "no colon", req("GET / HTTP/1.1", "X-A v"), Refuse(400)),
    Case("9112-5.1", "empty name", req("GET / HTTP/1.1", ": v"), Refuse(400)),
    Case("9110-5.1", "name with a parenthesis", req("GET / HTTP/1.1", "X(A): v"), Refuse(400)),
    Case("9110-5.1", "name with a non-ASCII byte", req("GET / HTTP/1.1", "X-\xe9: v"), Refuse(400)),
    Case("9110-5.5", "NUL in a value", req("GET / HTTP/1.1", "X-A: a\x00b"), Refuse(400)),
    Case("9110-5.5", "bare CR in a value", req("GET / HTTP/1.1", "X-A: a\rb"), Refuse(400)),
    Case("9110-5.5", "vertical tab in a value", req("GET / HTTP/1.1", "X-A: a\x0bb"), Refuse(400)),
    Case("9110-5.5", "DEL in a value", req("GET / HTTP/1.1", "X-A: a\x7fb"), Refuse(400)),
    Case("9112-5.2", "obsolete line folding", req("GET / HTTP/1.1", "X-A: a", " b"), Refuse(400)),
    Case("9112-5.2", "obsolete folding with a tab", req("GET / HTTP/1.1", "X-A: a", "\tb"),
         Refuse(400)),
    Case("9110-5.3", "two Content-Type lines",
         req("POST / HTTP/1.1", "Content-Type: a/b", "Content-Type: c/d", "Content-Length: 0"),
         Refuse(400)),
    # --- RFC 9112 6: message body -----------------------------------------------------
    Case("9112-6.2", "Content-Length body", req("POST / HTTP/1.1", "Content-Length: 5", body=b"hello"),
         Serve({"body": "hello"})),
    Case("9112-6.2", "Content-Length 0", req("POST / HTTP/1.1", "Content-Length: 0"),
         Serve({"body": ""})),
    Case("9112-6.2", "Content-Length with leading zeros", req("POST / HTTP/1.1", "Content-Length: 003",
                                                             body=b"abc"), Serve({"body": "abc"})),
    Case("9112-6.3", "two different Content-Length lines",
         req("POST / HTTP/1.1", "Content-Length: 3", "Content-Length: 4", body=b"abcd"), Refuse(400)),
    Case("9112-6.3", "Content-Length list", req("POST / HTTP/1.1", "Content-Length: 3, 3",
                                               body=b"abc"), Refuse(400)),
    Case("9112-6.3", "negative Content-Length", req("POST / HTTP/1.1", "Content-Length: -1"),
         Refuse(400)),
    Case("9112-6.3", "signed Content-Length", req("POST / HTTP/1.1", "Content-Length: +3",
                                                 body=b"abc"), Refuse(400)),
    Case("9112-6.3", "hex Content-Length", req("POST / HTTP/1.1", "Content-Length: 0x3",
                                              body=b"abc"), Refuse(400)),
    Case("9112-6.3", "space before the colon of Content-Length",
         req("POST / HTTP/1.1", "Content-Length : 3", body=b"abc"), Refuse(400)),
    Case("9112-6.3", "Content-Length with a superscript digit",
         req("POST / HTTP/1.1", "Content-Length: \xb3", body=b"abc"), Refuse(400)),
    Case("9112-6.1", "Content-Length and Transfer-Encoding",
         req("POST / HTTP/1.1", "Content-Length: 3", "Transfer-Encoding: chunked",
             body=b"3\r\nabc\r\n0\r\n\r\n"), Refuse(400)),
    Case("9112-6.1", "Transfer-Encoding in HTTP/1.0",
         req("POST / HTTP/1.0", "Transfer-Encoding: chunked", body=b"0\r\n\r\n", host=""),
         Refuse(400)),
    Case("9112-6.1", "Transfer-Encoding not ending in chunked",
         req("POST / HTTP/1.1", "Transfer-Encoding: chunked, identity", body=b"0\r\n\r\n"),
         Refuse(400)),
    Case("9112-6.1", "chunked twice", req("POST / HTTP/1.1", "Transfer-Encoding: chunked, chunked",
                                         body=b"0\r\n\r\n"), Refuse(400)),
    Case("9112-6.1", "gzip before chunked", req("POST / HTTP/1.1", "Transfer-Encoding: gzip, chunked",
                                               body=b"0\r\n\r\n"), Refuse(501)),
    Case("9112-6.1", "identity transfer coding", req("POST / HTTP/1.1", "Transfer-Encoding: identity",
                                                    body=b"0\r\n\r\n"), Refuse(400)),
    Case("9112-6.1", "Transfer-Encoding with a vertical tab",
         req("POST / HTTP/1.1", "Transfer-Encoding: chunked\x0b", body=b"0\r\n\r\n"), Refuse(400)),
    Case("9112-6.1", "transfer coding in mixed case",
         req("POST / HTTP/1.1", "Transfer-Encoding: ChUnKeD", body=b"2\r\nhi\r\n0\r\n\r\n"),
         Serve({"body": "hi"})),
    # --- RFC 9112 7.1: chunked transfer coding ------------------------------------------
    Case("9112-7.1", "chunked body", req("POST / HTTP/1.1", "Transfer-Encoding: chunked",
                                        body=b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"),
         Serve({"body": "abcde"})),
    Case("9112-7.1", "upper-case hex size", req("POST / HTTP/1.1", "Transfer-Encoding: chunked",
                                               body=b"A\r\n0123456789\r\n0\r\n\r\n"),
         Serve({"body": "0123456789"})),
    Case("9112-7.1.1", "chunk extension", req("POST / HTTP/1.1", "Transfer-Encoding: chunked",
                                             body=b'3;a=b;c="d e"\r\nabc\r\n0\r\n\r\n'),
         Serve({"body": "abc"})),
    Case("9112-7.1.2", "trailer field is accepted and dropped",
         req("POST / HTTP/1.1", "Transfer-Encoding: chunked",
             body=b"3\r\nabc\r\n0\r\nX-Checksum: 1\r\n\r\n"), Serve({"body": "abc"})),
    Case("9112-7.1.2", "Content-Length in the trailer",
         req("POST / HTTP/1.1", "Transfer-Encoding: chunked",
             body=b"3\r\nabc\r\n0\r\nContent-Length: 3\r\n\r\n"), Refuse(400)),
    Case("9112-7.1.2", "malformed trailer line", req("POST / HTTP/1.1", "Transfer-Encoding: chunked",
                                                    body=b"3\r\nabc\r\n0\r\nbad trailer\r\n\r\n"),
         Refuse(400)),
    Case("9112-7.1", "chunk size with 17 digits", req("POST / HTTP/1.1", "Transfer-Encoding: chunked",
                                                     body=b"00000000000000003\r\nabc\r\n0\r\n\r\n"),
         Refuse(400)),
    Case("9112-7.1", "non-hex chunk size", req("POST / HTTP/1.1", "Transfer-Encoding: chunked",
                                              body=b"g\r\nabc\r\n0\r\n\r\n"), Refuse(400)),
    Case("9112-7.1", "signed chunk size", req("POST / HTTP/1.1", "Transfer-Encoding: chunked",
                                             body=b"+3\r\nabc\r\n0\r\n\r\n"), Refuse(400)),
    Case("9112-7.1", "0x chunk size", req("POST / HTTP/1.1", "Transfer-Encoding: chunked",
                                         body=b"0x3\r\nabc\r\n0\r\n\r\n"), Refuse(400)),
    Case("9112-7.1", "chunk data longer than its size",
         req("POST / HTTP/1.1", "Transfer-Encoding: chunked", body=b"3\r\nabcd\r\n0\r\n\r\n"),
         Refuse(400)),
    Case("9112-7.1", "bare LF after the chunk size", req("POST / HTTP/1.1", "Transfer-Encoding: chunked",
                                                        body=b"3\nabc\r\n0\r\n\r\n"), Refuse(400)),
    Case("9112-7.1", "space after the chunk size", req("POST / HTTP/1.1", "Transfer-Encoding: chunked",
                                                      body=b"3 \r\nabc\r\n0\r\n\r\n"), Refuse(400)),
    Case("9112-7.1.1", "empty chunk extension", req("POST / HTTP/1.1", "Transfer-Encoding: chunked",
                                                   body=b"3;\r\nabc\r\n0\r\n\r\n"), Refuse(400)),
    Case("9112-7.1.1", "unterminated quoted extension",
         req("POST / HTTP/1.1", "Transfer-Encoding: chunked", body=b'3;a="b\r\nabc\r\n0\r\n\r\n'),
         Refuse(400)),
    # --- RFC 9110 10.1.1: Expect -----------------------------------------------------------
    Case("9110-10.1.1", "Expect 100-continue with the body sent",
         req("POST / HTTP/1.1", "Expect: 100-continue", "Content-Length: 2", body=b"hi"),
         Serve({"body": "hi"})),
    # --- limits (CORPUS_LIMITS, counted as Gunicorn counts them) ----------------------------
    Case("limits", "request line at the limit (CRLF not counted)", req(line_of(100)), Serve({})),
    Case("limits", "request line one byte over", req(line_of(101)), Refuse(414)),
    Case("limits", "header line at the limit (CRLF counted)", req("GET / HTTP/1.1", sized(100)),
         Serve({})),
    Case("limits", "header line one byte over", req("GET / HTTP/1.1", sized(101)), Refuse(431)),
    Case("limits", "as many header lines as the limit",
         req("GET / HTTP/1.1", *[f"X-{i}: v" for i in range(9)]), Serve({})),
    Case("limits", "one header line too many",
         req("GET / HTTP/1.1", *[f"X-{i}: v" for i in range(10)]), Refuse(431)),
]


# --- running a case -------------------------------------------------------------------

import json  # noqa: E402
import re  # noqa: E402
import socket  # noqa: E402
import ssl  # noqa: E402
import time  # noqa: E402

_STATUS = re.compile(rb"HTTP/1\.[01] (\d{3})")


def exchange(port, raw, timeout=3.0, tls=None):
    """Send `raw` on a new connection (over TLS with `tls`, a client's
    ssl.SSLContext); return (status, body) of the first final response,
    status None if the server closed (or stayed silent) without one. 1xx
    responses are skipped."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as plain:
        if tls is None:
            return _exchange(plain, raw, timeout)
        with tls.wrap_socket(plain, server_hostname="localhost") as sock:
            return _exchange(sock, raw, timeout)


def _exchange(sock, raw, timeout):
    try:
        sock.sendall(raw)
    except (BrokenPipeError, ConnectionResetError):
        pass
    buf = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        head, sep, rest = buf.partition(b"\r\n\r\n")
        if sep:
            match = _STATUS.match(head)
            if match is None:
                return None, b""
            status = int(match.group(1))
            if status < 200:
                buf = rest
                continue
            length = re.search(rb"(?im)^content-length:\s*(\d+)", head)
            if length is None or len(rest) >= int(length.group(1)):
                return status, rest
        try:
            data = sock.recv(65536)
        except (ConnectionResetError, TimeoutError, ssl.SSLError):  # SSLEOFError: closed
            data = b""
        if not data:
            match = _STATUS.match(buf)
            return (int(match.group(1)) if match else None), buf.partition(b"\r\n\r\n")[2]
        buf += data
    return None, b""


def on_connection(raw, limits, app):
    """What the server answers `raw` with, decided by forkserve's connection
    object alone (no socket): (status, body) as exchange() returns them.
    `app` is the WSGI application that a served request reaches."""
    import io
    from forkserve.http.environ import request_environ
    from forkserve.http.h1 import RequestError
    from forkserve.http.protocol import END, NEED_DATA, PEER_CLOSED, Connection, Request

    connection = Connection(limits)
    connection.receive_data(raw)
    connection.receive_data(b"")  # the client sent everything it will send
    try:
        event = connection.next_event()
        if not isinstance(event, Request):
            return None, b""  # closed (or silent) without a complete request
        env = request_environ({"SCRIPT_NAME": ""}, event)
        body = []
        while (event := connection.next_event()) is not END:
            if event is NEED_DATA or event is PEER_CLOSED:
                return None, b""
            body.append(event.data)
    except RequestError as refusal:
        return refusal.status, b""
    env["wsgi.input"] = io.BytesIO(b"".join(body))
    answer = []
    result = app(env, lambda status, headers, exc_info=None: answer.append(status))
    return int(answer[0][:3]), b"".join(result)


def verdict(case, status, body, exact=True):
    """(passed, what happened): a Serve case passes on 200 with the expected
    environ; a Refuse case on its status (`exact`) or any refusal."""
    if isinstance(case.expect, Serve):
        if status != 200:
            return False, f"refused ({status})"
        try:
            seen = json.loads(body)
        except ValueError:
            return False, "served, unreadable body"
        wrong = {k: seen.get(k) for k, v in case.expect.env.items() if seen.get(k) != v}
        return not wrong, f"served{', but saw ' + repr(wrong) if wrong else ''}"
    refused = status is None or status >= 400
    if not refused:
        return False, f"served ({status})"
    return (status == case.expect.status) if exact else True, f"refused ({status})"
