"""statsd_host, statsd_prefix, dogstatsd_tags: Gunicorn's metric names, types
and datagrams, sent to a real UDP listener on loopback, beside the real Gunicorn."""

import logging
import os
import re
import socket

import pytest

from forkserve import statsd
from forkserve_testing import poll, ServerProcess

APPS = os.path.join(os.path.dirname(__file__), "apps")


@pytest.fixture
def listener():
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(5)
    yield sock
    sock.close()


def received(sock):
    """The datagrams waiting in `sock`, decoded."""
    sock.setblocking(False)
    found = []
    try:
        while True:
            found.append(sock.recv(65536).decode("ascii"))
    except BlockingIOError:
        return found
    finally:
        sock.settimeout(5)


def test_a_request_sends_gunicorns_three_metrics_prefixed_and_tagged(listener):
    client = statsd.Statsd("127.0.0.1:%d" % listener.getsockname()[1], prefix="shop..",
                           tags="env:prod,team:a")
    try:
        client.request(404, 0.0125)
        sent = [listener.recv(512).decode() for _ in range(3)]
    finally:
        client.close()
    assert sent == ["shop.gunicorn.request.duration:12.5|ms|#env:prod,team:a",
                    "shop.gunicorn.requests:1|c|@1.0|#env:prod,team:a",
                    "shop.gunicorn.request.status.404:1|c|@1.0|#env:prod,team:a"]


def test_the_workers_gauge_is_sent_when_the_count_changes_only(listener):
    class Cfg:
        statsd_host = "127.0.0.1:%d" % listener.getsockname()[1]
        statsd_prefix = ""
        dogstatsd_tags = ""
    log = logging.getLogger("test.statsd.gauge")
    statsd.setup(Cfg, log)
    try:
        for count in (2, 2, 3, 3, 2):
            statsd.workers(count)
        log.warning("a warning")
        log.error("an error")
        try:
            raise ValueError("x")
        except ValueError:
            log.exception("an exception")
        log.critical("critical")
        sent = [listener.recv(512).decode() for _ in range(7)]
    finally:
        statsd.setup(type("Off", (), {"statsd_host": None}), log)
    assert sent == ["gunicorn.workers:2|g", "gunicorn.workers:3|g", "gunicorn.workers:2|g",
                    "gunicorn.log.warning:1|c|@1.0", "gunicorn.log.error:1|c|@1.0",
                    "gunicorn.log.exception:1|c|@1.0", "gunicorn.log.critical:1|c|@1.0"]
    assert statsd.client is None and not log.handlers


def test_a_send_that_fails_is_counted_and_logged_once(caplog):
    gone = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    gone.bind(("127.0.0.1", 0))
    address = "127.0.0.1:%d" % gone.getsockname()[1]
    gone.close()  # nobody listens: the kernel answers ECONNREFUSED to the next send
    client = statsd.Statsd(address)
    try:
        with caplog.at_level(logging.WARNING, "forkserve.error"):
            for _ in range(20):
                client.request(200, 0.001)
        assert client.failed >= 19  # the first send may go before the refusal comes back
        assert len([r for r in caplog.records if "statsd" in r.getMessage()]) == 1
    finally:
        client.close()


def test_a_full_socket_drops_the_metric_instead_of_waiting(tmp_path):
    path = str(tmp_path / "statsd.sock")
    deaf = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    deaf.bind(path)  # never reads: its queue fills, and a blocking send() would wait
    client = statsd.Statsd("unix://" + path)
    try:
        for _ in range(5000):
            client.counter("gunicorn.requests")
        assert 0 < client.failed < 5000
    finally:
        client.close()
        deaf.close()


@pytest.mark.parametrize("value, expected", [
    ("localhost:9125", (socket.AF_INET, ("localhost", 9125))),
    ("statsd.local", (socket.AF_INET, ("statsd.local", 8125))),
    ("[::1]:9000", (socket.AF_INET6, ("::1", 9000))),
    ("unix:///run/statsd.sock", (socket.AF_UNIX, "/run/statsd.sock")),
    ("unix:/run/statsd.sock", (socket.AF_UNIX, "/run/statsd.sock")),
])
def test_statsd_host_is_read_as_gunicorn_reads_it(value, expected):
    assert statsd.parse_address(value) == expected


def test_a_bad_statsd_host_is_refused_at_start_with_what_to_give(tmp_path):
    from forkserve.config.settings import ConfigError, parse
    with pytest.raises(ConfigError, match="HOST:PORT or unix://PATH"):
        parse(["--statsd-host", "localhost:port", "a:b"], environ={}, cwd=str(tmp_path))


def metric_kinds(datagrams):
    """{name: type} of statsd datagrams (values left out: timings differ)."""
    kinds = {}
    for datagram in datagrams:
        match = re.fullmatch(r"([\w.]+):[-\d.]+\|(c|ms|g|h)(\|@[\d.]+)?(\|#.*)?", datagram)
        assert match, datagram
        kinds[match.group(1)] = match.group(2) + (match.group(3) or "") + (match.group(4) or "")
    return kinds


@pytest.mark.e2e
@pytest.mark.parametrize("server", ["forkserve", "gunicorn"])
def test_fifty_requests_send_the_metrics_gunicorn_sends(server, listener, tmp_path):
    if server == "gunicorn":
        pytest.importorskip("gunicorn")
    from test_gunicorn_e2e import GunicornProcess
    args = ("--statsd-host", "127.0.0.1:%d" % listener.getsockname()[1],
            "--statsd-prefix", "shop", "--dogstatsd-tags", "env:test", "-k", "gevent")
    if server == "gunicorn":
        process = GunicornProcess(args, app="basic:app", log_dir=tmp_path, cwd=APPS)
    else:
        process = ServerProcess(("-w", "1", *args), app="basic:app", cwd=APPS, log_dir=tmp_path)
    try:
        process.wait_listening()
        datagrams = []

        def workers_gauge():
            datagrams.extend(received(listener))
            return any("gunicorn.workers" in d for d in datagrams)
        poll(workers_gauge, message="the gunicorn.workers gauge")
        for n in range(50):
            assert process.get("/pid" if n % 5 else "/missing")[0] in (200, 404)

        def all_counted():
            datagrams.extend(received(listener))
            return sum(d.startswith("shop.gunicorn.requests:") for d in datagrams) == 50
        poll(all_counted, message="50 gunicorn.requests counters")
    finally:
        process.kill_group()
    kinds = metric_kinds(datagrams)
    assert kinds == {"shop.gunicorn.workers": "g|#env:test",
                     "shop.gunicorn.requests": "c|@1.0|#env:test",
                     "shop.gunicorn.request.duration": "ms|#env:test",
                     "shop.gunicorn.request.status.200": "c|@1.0|#env:test",
                     "shop.gunicorn.request.status.404": "c|@1.0|#env:test"}, datagrams
    assert sum(".status.404:" in d for d in datagrams) == 10
    assert "shop.gunicorn.workers:1|g|#env:test" in datagrams
