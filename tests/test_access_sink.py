"""logs.access_sink: what the server calls per request, and what reaches the
file (no sockets; the file handler's timer is never waited for: the tests
flush)."""

import logging
import time

import pytest

from forkserve import logs
from forkserve.http.accesslog import DEFAULT, AccessFormat

ENVIRON = {"REMOTE_ADDR": "192.0.2.1", "HTTP_USER_AGENT": "curl/8", "HTTP_REFERER": "http://r/"}


@pytest.fixture
def access_file(tmp_path):
    path = tmp_path / "access.log"
    handler = logs.AccessFileHandler(str(path), encoding="utf-8")
    saved = (list(logs.access_log.handlers), logs.access_log.level, logs.access_log.disabled)
    for old in saved[0]:
        logs.access_log.removeHandler(old)
    logs.access_log.addHandler(handler)
    logs.access_log.setLevel(logging.INFO)
    logs.access_log.disabled = False
    yield path, handler
    logs.access_log.removeHandler(handler)
    handler.close()
    for old in saved[0]:
        logs.access_log.addHandler(old)
    logs.access_log.setLevel(saved[1])
    logs.access_log.disabled = saved[2]


def lines_of(path):
    return path.read_text(encoding="utf-8").splitlines()


@pytest.mark.parametrize("fmt", [DEFAULT, '%(h)s "%(r)s" %(s)s %(D)s'])
def test_a_request_reaches_the_file_as_the_format_writes_it(access_file, fmt):
    path, handler = access_file
    access = AccessFormat(fmt)
    sink = logs.access_sink(access)
    agents = ["plain", 'has "quotes"', "new\nline"]
    for agent in agents:
        sink({**ENVIRON, "HTTP_USER_AGENT": agent}, "GET /x HTTP/1.1", 200, (), 5,
             time.perf_counter())
    assert lines_of(path) == []  # held until the block is written
    handler.flush()
    written = lines_of(path)
    assert len(written) == 3
    for agent, line in zip(agents, written):
        expected = access.line({**ENVIRON, "HTTP_USER_AGENT": agent}, "GET /x HTTP/1.1", 200,
                               (), 5, 0.0)
        if "%(D)s" in fmt:  # microseconds differ: compare the rest
            line, expected = line.rsplit(" ", 1)[0], expected.rsplit(" ", 1)[0]
        else:  # DEFAULT; the stamp may have turned a second: compare around it
            line, expected = line.split("[")[0] + line.split("]", 1)[1], \
                expected.split("[")[0] + expected.split("]", 1)[1]
        assert line == expected


def test_a_full_block_is_written_without_waiting_for_the_timer(access_file):
    path, handler = access_file
    sink = logs.access_sink(AccessFormat())
    for _ in range(handler.max_pending):
        sink(ENVIRON, "GET / HTTP/1.1", 204, (), 0, time.perf_counter())
    assert len(lines_of(path)) == handler.max_pending


def test_nothing_is_written_while_the_access_logger_is_disabled(access_file):
    path, handler = access_file
    sink = logs.access_sink(AccessFormat())
    sink(ENVIRON, "GET /before HTTP/1.1", 200, (), 1, time.perf_counter())
    logs.access_log.disabled = True  # as a logging config with disable_existing_loggers does
    sink(ENVIRON, "GET /during HTTP/1.1", 200, (), 1, time.perf_counter())
    handler.flush()
    logs.access_log.disabled = False
    sink(ENVIRON, "GET /after HTTP/1.1", 200, (), 1, time.perf_counter())
    handler.flush()
    assert [line.split('"')[1] for line in lines_of(path)] == ["GET /after HTTP/1.1"]
