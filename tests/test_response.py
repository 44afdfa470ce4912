"""forkserve.http.response: the WSGI response head, checked and framed without sockets."""

import pytest

from forkserve.http.response import (ApplicationError, check_start_response, encode_head,
                                     plan_head)

TEXT = [("Content-Type", "text/plain")]


def head(status="200 OK", headers=TEXT, total=None, version="HTTP/1.1", head_request=False,
         close=None, date="D"):
    code, lines, dated, declared, chunked, must_close = plan_head(
        status, headers, total, version, head_request)
    close = must_close if close is None else close
    raw = encode_head(lines, close, version, None if dated else date)
    return raw.decode("latin-1"), declared, chunked, must_close


@pytest.mark.parametrize("status", ["200", "2000 OK", "OK 200", b"200 OK", "200 O\nK", "20x OK"])
def test_start_response_refuses_a_malformed_status(status):
    with pytest.raises(ApplicationError, match="invalid status"):
        check_start_response(status, [])


def test_start_response_needs_a_list_of_headers():
    with pytest.raises(ApplicationError, match="must be a list"):
        check_start_response("200 OK", (("A", "b"),))


def test_known_length_gets_content_length_and_the_server_date():
    raw, declared, chunked, close = head(total=5)
    assert raw == ("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n"
                   "Date: D\r\n\r\n")
    assert (declared, chunked, close) == (None, False, False)


def test_unknown_length_is_chunked_in_http11_and_ends_with_the_close_in_http10():
    raw, _, chunked, close = head()
    assert "Transfer-Encoding: chunked\r\n" in raw and chunked and not close
    raw, _, chunked, close = head(version="HTTP/1.0")
    assert "Transfer-Encoding" not in raw and not chunked and close
    assert raw.endswith("Connection: close\r\nDate: D\r\n\r\n")


def test_keep_alive_in_http10_is_announced():
    raw, *_ = head(version="HTTP/1.0", total=2, close=False)
    assert "Connection: keep-alive\r\n" in raw


def test_the_application_content_length_is_kept_and_enforced_except_for_head():
    raw, declared, chunked, _ = head(headers=TEXT + [("Content-Length", "10")], total=3)
    assert raw.count("Content-Length") == 1 and "Content-Length: 10\r\n" in raw
    assert (declared, chunked) == (10, False)
    _, declared, _, _ = head(headers=[("Content-Length", "10")], head_request=True)
    assert declared is None


def test_no_body_and_no_framing_for_204_304_and_head():
    raw, declared, chunked, _ = head("204 No Content", [("Content-Length", "4")], total=4)
    assert "Content-Length" not in raw and not chunked and declared is None
    raw, declared, chunked, _ = head("304 Not Modified", [("Content-Length", "4")])
    assert "Content-Length: 4" in raw and declared is None and not chunked
    raw, _, chunked, close = head(head_request=True)
    assert "Transfer-Encoding: chunked" in raw and not chunked and not close


def test_hop_by_hop_headers_from_the_application_are_the_servers():
    raw, _, _, close = head(headers=[("Connection", "close"), ("Transfer-Encoding", "chunked")],
                            total=1)
    assert raw.count("Connection") == 1 and "Transfer-Encoding" not in raw and close
    raw, _, _, close = head(headers=[("Connection", "keep-alive")], total=1)
    assert "Connection" not in raw and not close


def test_the_application_date_is_kept():
    raw, *_ = head(headers=[("Date", "Mon, 01 Jan 2024 00:00:00 GMT")], total=0)
    assert raw.count("Date") == 1 and "Date: Mon, 01 Jan 2024" in raw


@pytest.mark.parametrize("headers, message", [
    ([("X-A", "a\r\nSet-Cookie: x")], "invalid response header"),
    ([("X-A", "a\x00")], "invalid response header"),
    ([("X A", "v")], "invalid response header"),
    ([("", "v")], "invalid response header"),
    ([(b"X-A", "v")], "must be (str, str) tuples"),
    ([("X-A", 1)], "must be (str, str) tuples"),
    ([("X-A",)], "must be (str, str) tuples"),
    ([("Content-Length", "1"), ("Content-Length", "1")], "repeated Content-Length"),
    ([("Content-Length", "-1")], "invalid or repeated Content-Length"),
    ([("Content-Length", "\u00b2")], "invalid or repeated Content-Length"),
])
def test_invalid_headers_from_the_application_never_reach_the_wire(headers, message):
    with pytest.raises(ApplicationError, match=message.replace("(", r"\(").replace(")", r"\)")):
        head(headers=headers)


def test_non_latin1_header_and_1xx_status_are_application_errors():
    with pytest.raises(ApplicationError, match="latin-1"):
        head("200 \u20ac")
    with pytest.raises(ApplicationError, match="1xx"):
        head("101 Switching Protocols")


def test_a_name_or_value_seen_valid_does_not_let_an_invalid_header_through():
    assert plan_head("200 OK", [("X-Seen", "fine")], 0, "HTTP/1.1", False)[1]
    with pytest.raises(ApplicationError, match="invalid response header"):
        plan_head("200 OK", [("X-Seen", "split\r\nX-Evil: 1")], 0, "HTTP/1.1", False)
    with pytest.raises(ApplicationError, match="invalid response header"):
        plan_head("200 OK", [("Bad Name", "fine")], 0, "HTTP/1.1", False)
    with pytest.raises(ApplicationError, match="must be"):
        plan_head("200 OK", [("X-Seen", b"fine")], 0, "HTTP/1.1", False)


def test_no_module_keeps_header_values_after_a_request():
    """No memo: a request's and a response's header values (a session cookie,
    a token) are nowhere in forkserve.http's module globals afterwards."""
    import sys
    from forkserve.http.protocol import Connection
    from forkserve.http.h1 import Limits
    connection = Connection(Limits())
    connection.receive_data(b"GET / HTTP/1.1\r\nHost: t\r\nCookie: session=SECRET-IN\r\n\r\n")
    connection.next_event()
    connection.response_head("200 OK", [("Set-Cookie", "session=SECRET-OUT")], b"", 0,
                             "Thu, 01 Jan 1970 00:00:00 GMT")
    del connection

    def holds(value, depth=0):
        if isinstance(value, (str, bytes)):
            return b"SECRET" in (value if isinstance(value, bytes) else value.encode("latin-1",
                                                                                   "replace"))
        if depth < 2 and isinstance(value, dict):
            return any(holds(k, depth + 1) or holds(v, depth + 1) for k, v in value.items())
        if depth < 2 and isinstance(value, (list, tuple, set, frozenset)):
            return any(holds(item, depth + 1) for item in value)
        return False
    for name, module in list(sys.modules.items()):
        if name.startswith("forkserve.http"):
            kept = [key for key, value in vars(module).items() if holds(value)]
            assert not kept, f"{name} keeps a header value in {kept}"


def test_the_fixed_tables_let_through_only_valid_names_and_statuses():
    """A name or status found in the tables skips the checks, so each entry
    must pass them: a token name with its own lower case, a status the checks
    accept with its own code."""
    from forkserve.http.response import _COMMON_NAMES, _NAME, STATUS_CODES
    for name, lower in _COMMON_NAMES.items():
        assert _NAME.fullmatch(name) and lower == name.lower()
    for status, code in STATUS_CODES.items():
        assert status.isprintable() and status[3] == " " and int(status[:3]) == code


@pytest.mark.parametrize("status", [["200 OK"], {"200 OK": 1}, b"200 OK", "200", None])
def test_the_responders_start_response_refuses_what_the_checker_refuses(status):
    """The responder's shortcut for the usual status must not let anything
    else skip the check, nor fail otherwise (an unhashable status)."""
    from forkserve.http.responder import Responder
    responder = Responder(None, None, None, "peer")
    with pytest.raises(ApplicationError, match="invalid status"):
        responder.start_response(status, [])
    assert responder.start_response("200 OK", []) == responder.write
