"""forkserve.http.cuts.CutLog: when a cut response gets its log line (an
injected clock; no sockets)."""

from forkserve.http.cuts import CutLog
from test_shortage import Clock


def test_the_first_cut_is_logged_at_once_with_client_request_bytes_and_reason():
    log = CutLog(Clock())
    assert log.cut("10.0.0.7", "GET /big HTTP/1.1", 1234567, 67108864, "the client went away") \
        == ("response cut: GET /big HTTP/1.1 from 10.0.0.7, 1,234,567 of 67,108,864 body bytes "
            "sent: the client went away")


def test_a_streamed_body_of_unknown_length_gives_the_bytes_sent_alone():
    assert CutLog(Clock()).cut("unix", "GET /s HTTP/1.1", 10, None, "why") \
        == "response cut: GET /s HTTP/1.1 from unix, 10 body bytes sent: why"


def test_the_request_line_is_escaped_for_the_log():
    line = CutLog(Clock()).cut("1.2.3.4", 'GET /"\x1b HTTP/1.1', 0, 5, "why")
    assert "\x1b" not in line and '"' not in line


def test_at_most_one_line_per_interval_and_the_next_counts_the_cuts_not_logged():
    clock = Clock()
    log = CutLog(clock)
    assert log.cut("a", "GET / HTTP/1.1", 1, 2, "why") is not None
    for _ in range(5):
        clock.now += 1
        assert log.cut("b", "GET / HTTP/1.1", 1, 2, "why") is None
    clock.now += log.interval
    line = log.cut("c", "GET / HTTP/1.1", 1, 2, "why")
    assert line.endswith("(5 more cut in the last 15 s, not logged)")
    clock.now += log.interval
    assert "more cut" not in log.cut("d", "GET / HTTP/1.1", 1, 2, "why")


def test_report_logs_the_line_as_a_warning(caplog):
    import logging
    logger = logging.getLogger("forkserve.test_cuts")
    log = CutLog(Clock(), logger)
    with caplog.at_level(logging.INFO, logger.name):
        log.report("a", "GET / HTTP/1.1", 1, 2, "why")
        log.report("a", "GET / HTTP/1.1", 1, 2, "why")  # within the interval
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("WARNING", "response cut: GET / HTTP/1.1 from a, 1 of 2 body bytes sent: why")]
