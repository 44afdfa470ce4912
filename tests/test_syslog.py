"""syslog, syslog_addr, syslog_prefix, syslog_facility: both logs sent through
logging.handlers.SysLogHandler in Gunicorn's format, to a UDP and a unix
datagram listener on this machine, beside the real Gunicorn."""

import os
import re
import socket

import pytest

from forkserve.logs import parse_syslog_address
from forkserve_testing import ServerProcess, poll

APPS = os.path.join(os.path.dirname(__file__), "apps")


@pytest.mark.parametrize("address, expected", [
    ("udp://localhost:514", (socket.SOCK_DGRAM, ("localhost", 514))),
    ("udp://LogHost", (socket.SOCK_DGRAM, ("loghost", 514))),
    ("tcp://10.0.0.1:601", (socket.SOCK_STREAM, ("10.0.0.1", 601))),
    ("udp://[::1]:5514", (socket.SOCK_DGRAM, ("::1", 5514))),
    ("unix:///dev/log", (None, "/dev/log")),
    ("unix:///dev/log#dgram", (socket.SOCK_DGRAM, "/dev/log")),
])
def test_syslog_addr_is_read_as_gunicorn_reads_it(address, expected):
    assert parse_syslog_address(address) == expected


@pytest.mark.parametrize("bad", ["localhost:514", "http://x", "udp://h:port", "unix://"])
def test_a_bad_syslog_addr_is_refused_with_the_forms_it_takes(bad, tmp_path):
    from forkserve.config.settings import ConfigError, parse
    with pytest.raises(ConfigError, match="syslog_addr"):
        parse(["--log-syslog-to", bad, "a:b"], environ={}, cwd=str(tmp_path))


def test_an_unknown_facility_is_refused(tmp_path):
    from forkserve.config.settings import ConfigError, parse
    with pytest.raises(ConfigError, match="local0"):
        parse(["--log-syslog-facility", "locl0", "a:b"], environ={}, cwd=str(tmp_path))


def lines_of(sock, count_until):
    """Datagrams from `sock` until count_until(lines) holds (decoded)."""
    lines = []

    def enough():
        sock.setblocking(False)
        try:
            while True:
                lines.append(sock.recv(65536).decode("utf-8"))
        except BlockingIOError:
            pass
        return count_until(lines)
    poll(enough, message="syslog lines")
    return lines


def start(server, args, tmp_path):
    if server == "gunicorn":
        pytest.importorskip("gunicorn")
        from test_gunicorn_e2e import GunicornProcess
        process = GunicornProcess(("-k", "gevent", *args), app="basic:app", log_dir=tmp_path,
                                  cwd=APPS)
    else:
        process = ServerProcess(("-w", "1", *args), app="basic:app", cwd=APPS, log_dir=tmp_path)
    process.wait_listening()
    return process


@pytest.mark.e2e
@pytest.mark.parametrize("server", ["forkserve", "gunicorn"])
def test_both_logs_go_to_a_udp_syslog_in_gunicorns_format(server, tmp_path):
    listener = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    listener.bind(("127.0.0.1", 0))
    process = start(server, ("--log-syslog", "--log-syslog-to",
                             "udp://127.0.0.1:%d" % listener.getsockname()[1],
                             "--log-syslog-facility", "local3",
                             "--log-syslog-prefix", "shop"), tmp_path)
    try:
        assert process.get("/missing")[0] == 404
        lines = lines_of(listener, lambda lines: any(".access:" in line for line in lines))
    finally:
        process.kill_group()
        listener.close()
    # <PRI>: local3 (19) * 8 + info (6) = 158; the tag, then [pid] and the line
    error = [line for line in lines if "gunicorn.shop.error:" in line]
    access = [line for line in lines if "gunicorn.shop.access:" in line]
    assert error and all(re.fullmatch(r"<15\d>gunicorn\.shop\.error: \[\d+\] .+\x00", line,
                                      re.S) for line in error), error
    assert any("Listening at: http://127.0.0.1:" in line for line in error), error
    assert re.fullmatch(r'<158>gunicorn\.shop\.access: \[\d+\] 127\.0\.0\.1 - - \[.+\] '
                        r'"GET /missing HTTP/1\.1" 404 9 "-" "-"\x00', access[0]), access


@pytest.mark.e2e
def test_a_unix_datagram_syslog_gets_the_server_log_and_not_the_access_log_when_asked(
        tmp_path):
    path = str(tmp_path / "log.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(path)
    process = start("forkserve", ("--log-syslog", "--log-syslog-to", f"unix://{path}#dgram",
                                  "--disable-redirect-access-to-syslog", "-n", "api:v2"),
                    tmp_path)
    try:
        assert process.get("/pid")[0] == 200
        lines = lines_of(listener, lambda lines: any("Booting worker" in line or
                                                     "worker" in line for line in lines))
        process.signal(15)
        process.wait_exit()
        lines += lines_of(listener, lambda lines: True)
    finally:
        process.kill_group()
        listener.close()
    assert all(line.startswith("<14>gunicorn.api.v2.error: [") for line in lines), lines
    assert not any("GET /pid" in line for line in lines)
