"""Access log lines in Gunicorn's format, from the request's facts (no sockets).
The line-for-line comparison with the real Gunicorn is in test_gunicorn_e2e."""

import base64
import os

import pytest

from forkserve.http.accesslog import DEFAULT, AccessFormat

ENVIRON = {
    "REMOTE_ADDR": "192.0.2.1", "REQUEST_METHOD": "GET", "PATH_INFO": "/a b",
    "QUERY_STRING": "x=1", "SERVER_PROTOCOL": "HTTP/1.1", "HTTP_REFERER": "http://r/",
    "HTTP_USER_AGENT": "curl/8", "HTTP_X_REQUEST_ID": "abc", "CONTENT_TYPE": "text/plain",
    "wsgi.url_scheme": "https",
}
NOON = 1700000000.0  # a fixed wall-clock time


def line(fmt, environ=ENVIRON, status=200, headers=((b"Content-Type", b"text/html"),),
         sent=12, seconds=1.2345678):
    return AccessFormat(fmt).line(environ, "GET /a%20b?x=1 HTTP/1.1", status, headers, sent,
                                  seconds, now=NOON)


def test_default_is_gunicorns_combined_line_without_an_extra_field():
    text = line(DEFAULT)
    stamp = AccessFormat("%(t)s").line({}, "", 200, (), 0, 0, now=NOON)
    assert text == (f'192.0.2.1 - - {stamp} "GET /a%20b?x=1 HTTP/1.1" 200 12 "http://r/" '
                    '"curl/8"')


@pytest.mark.parametrize("atom, expected", [
    ("h", "192.0.2.1"), ("l", "-"), ("u", "-"), ("r", "GET /a%20b?x=1 HTTP/1.1"),
    ("m", "GET"), ("U", "/a b"), ("q", "x=1"), ("H", "HTTP/1.1"), ("s", "200"), ("B", "12"),
    ("b", "12"), ("f", "http://r/"), ("a", "curl/8"), ("T", "1"), ("D", "1234568"),
    ("M", "1234"), ("L", "1.234568"), ("p", f"<{os.getpid()}>"),
    ("{x-request-id}i", "abc"), ("{X-Request-Id}i", "abc"), ("{content-type}i", "text/plain"),
    ("{content-type}o", "text/html"), ("{wsgi.url_scheme}e", "https"),
    ("{REMOTE_ADDR}e", "192.0.2.1"), ("{absent}i", "-"), ("{absent}o", "-"),
    ("{absent}e", "-"), ("nonsense", "-"),
])
def test_each_atom_means_what_it_means_in_gunicorn(atom, expected):
    assert line(f"%({atom})s") == expected


def test_time_atom_is_the_common_log_format_stamp():
    import re
    assert re.fullmatch(r"\[\d\d/[A-Z][a-z]{2}/\d{4}:\d\d:\d\d:\d\d [+-]\d{4}\]", line("%(t)s"))


def test_basic_auth_user_is_logged_but_not_the_password():
    auth = "Basic " + base64.b64encode(b"alice:secret").decode()
    assert line("%(u)s", environ={**ENVIRON, "HTTP_AUTHORIZATION": auth}) == "alice"
    assert line("%(u)s", environ={**ENVIRON, "HTTP_AUTHORIZATION": "Bearer x"}) == "-"
    assert line("%(u)s", environ={**ENVIRON, "HTTP_AUTHORIZATION": "Basic !!"}) == "-"


def test_an_empty_body_is_zero_and_no_response_is_a_dash():
    assert line("%(b)s %(B)s", sent=0) == "0 0"
    assert line("%(s)s %(b)s", status=None, sent=None) == "- -"


def test_quotes_are_escaped_like_gunicorn_and_control_bytes_cannot_forge_a_line():
    environ = {**ENVIRON, "HTTP_USER_AGENT": 'a "b"\n127.0.0.1 - - fake\\'}
    assert line('"%(a)s"', environ=environ) == '"a \\"b\\"\\x0a127.0.0.1 - - fake\\\\"'


def test_the_last_of_repeated_response_headers_is_logged_as_in_gunicorn():
    headers = [("Set-Cookie", "a=1"), ("Set-Cookie", "b=2")]
    assert line("%({set-cookie}o)s", headers=headers) == "b=2"


def test_a_broken_format_is_refused_with_a_hint():
    with pytest.raises(ValueError, match="write atoms as"):
        AccessFormat("%(h)s %(")


@pytest.mark.parametrize("changes", [
    {}, {"HTTP_USER_AGENT": 'a "quoted" agent'}, {"HTTP_REFERER": "back\\slash"},
    {"HTTP_USER_AGENT": "new\nline"}, {"HTTP_USER_AGENT": "caf\u00e9"},
    {"HTTP_USER_AGENT": "del\x7f"}, {"REMOTE_ADDR": "::1"},
    {"HTTP_AUTHORIZATION": "Basic " + base64.b64encode("\u00e9ve:pw".encode()).decode()},
    {"HTTP_AUTHORIZATION": "Basic " + base64.b64encode(b"bob:pw").decode()},
])
@pytest.mark.parametrize("status, sent", [(200, 12), (304, 0), (None, None)])
def test_the_default_formats_own_path_writes_what_the_general_path_writes(changes, status, sent):
    environ = {**ENVIRON, **changes}
    request_line = "GET /a%20b?x=1 HTTP/1.1"
    fast = AccessFormat(DEFAULT)
    general = AccessFormat(DEFAULT + " ")  # not DEFAULT: takes the general path
    assert fast.line.__name__ == "_default_line" and general.line.__name__ == "line"
    expected = general.line(environ, request_line, status, (), sent, 0.5, now=NOON)[:-1]
    assert fast.line(environ, request_line, status, (), sent, 0.5, now=NOON) == expected
