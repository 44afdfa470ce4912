"""The request corpora against forkserve's HTTP/1.1 connection object
(forkserve.http.protocol.Connection) alone: bytes in, events out, no socket.

tests/rfc_corpus.py (the RFC 9110/9112 cases, also run end to end by
tests/test_rfc_e2e.py and beside Gunicorn by benchmarks/http_corpus.py) and
tests/httpcorpus.py (good requests, and bad ones by class with their status).
Every test here runs with socket creation forbidden: `pytest -k corpus`.
"""

import sys

import pytest

from conftest import APPS
from httpcorpus import GOOD, LIMITS, REJECTED
from rfc_corpus import CASES, CORPUS_LIMITS, on_connection, verdict

from forkserve.http.h1 import Limits, RequestError
from forkserve.http.protocol import END, NEED_DATA, PEER_CLOSED, Connection, Request

sys.path.insert(0, str(APPS))
from echo_environ import app as echo_app  # noqa: E402


# Any socket creation fails: these tests are bytes in, events out.
pytestmark = pytest.mark.usefixtures("no_sockets", "head_path")


RFC_LIMITS = Limits(**{name.replace("-", "_"): value for name, value in CORPUS_LIMITS.items()})
TEST_LIMITS = Limits(**LIMITS)


@pytest.mark.parametrize("case", CASES, ids=[f"{c.section} {c.name}" for c in CASES])
def test_rfc_corpus_case_on_the_connection_object(case):
    passed, happened = verdict(case, *on_connection(case.raw, RFC_LIMITS, echo_app))
    assert passed, f"{case.section} {case.name}: expected {case.expect}, {happened}"


def test_rfc_corpus_counts_are_unchanged():
    """39 valid and 77 invalid cases, every one passing (as before the
    connection object; benchmarks/http_corpus.py prints the same counts)."""
    valid = sum(type(case.expect).__name__ == "Serve" for case in CASES)
    assert (valid, len(CASES) - valid) == (39, 77)


REFUSALS = [pytest.param(status, raw, id=f"{cls} {i}")
            for cls, (status, raws) in REJECTED.items() for i, raw in enumerate(raws)]


@pytest.mark.parametrize("status, raw", REFUSALS)
def test_refusal_corpus_request_is_refused_with_its_status_and_nothing_after(status, raw):
    connection = Connection(TEST_LIMITS)
    connection.receive_data(raw)
    with pytest.raises(RequestError) as refused:
        while (event := connection.next_event()) is not END:
            assert event is not NEED_DATA and event is not PEER_CLOSED, \
                "waited for more instead of refusing"
    assert refused.value.status == status, refused.value.reason
    assert not connection.keep_alive
    assert connection.refusal(status).startswith(f"HTTP/1.1 {status} ".encode())
    assert b"\r\nConnection: close\r\n" in connection.refusal(status)
    with pytest.raises(RuntimeError):  # nothing is parsed after a refusal
        connection.next_event()


@pytest.mark.parametrize("raw", GOOD, ids=[repr(raw[:40])[2:-1] for raw in GOOD])
def test_good_corpus_request_gives_its_head_then_its_body_then_the_end(raw):
    connection = Connection(TEST_LIMITS)
    connection.receive_data(raw)
    requests = 0
    while True:
        event = connection.next_event()
        if event is NEED_DATA:
            break
        assert isinstance(event, Request), event
        requests += 1
        while (event := connection.next_event()) is not END:
            assert event is not NEED_DATA, "the body was all sent"
        connection.response_head("200 OK", [], b"ok", 2, "Thu, 01 Jan 1970 00:00:00 GMT")
        connection.response_end()
        if not connection.start_next_cycle():
            break
    assert requests == raw.count(b" HTTP/1.")
