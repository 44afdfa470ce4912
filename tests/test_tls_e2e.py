"""TLS on listeners (certfile, keyfile, ca_certs, cert_reqs), with real clients
(Python's ssl and http.client, curl) and certificates the test makes with the
openssl CLI, beside the real Gunicorn on the same files."""

import http.client
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time

import pytest

from forkserve_testing import ServerProcess, poll
from tls_pki import client_context, make_pki

pytestmark = pytest.mark.e2e

APPS = os.path.join(os.path.dirname(__file__), "apps")


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """A CA, a server certificate and a second one (for a reload), a client
    certificate from the CA and one from another CA."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is needed to make the certificates")
    return make_pki(str(tmp_path_factory.mktemp("pki")))


@pytest.fixture
def start(tmp_path, pki):
    """start(kind, *args) -> a listening TLS server on copies of the pki's server files
    (tmp_path/cert.pem, key.pem), serving tls_site:app."""
    started = []
    shutil.copy(os.path.join(pki, "server.pem"), tmp_path / "cert.pem")
    shutil.copy(os.path.join(pki, "server.key"), tmp_path / "key.pem")

    def begin(kind, *args, app="tls_site:app"):
        tls = ("--certfile", str(tmp_path / "cert.pem"), "--keyfile", str(tmp_path / "key.pem"),
               *args)
        if kind == "gunicorn":
            pytest.importorskip("gunicorn")
            from test_gunicorn_e2e import GunicornProcess
            server = GunicornProcess(("-k", "gevent", *tls), app=app, log_dir=tmp_path, cwd=APPS)
        else:
            server = ServerProcess(("-w", "1", *tls), app=app, cwd=APPS, log_dir=tmp_path)
        started.append(server)
        server.wait_listening()
        return server

    yield begin
    for server in started:
        server.kill_group()


def get(port, context, path="/", count=1):
    """`count` GETs on one kept-alive connection: [(status, body)], and the
    server's certificate subject."""
    connection = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=10)
    try:
        connection.connect()
        subject = dict(pair[0] for pair in connection.sock.getpeercert()["subject"])
        answers = []
        for _ in range(count):
            connection.request("GET", path)
            response = connection.getresponse()
            answers.append((response.status, response.read().decode()))
        return answers, subject["commonName"]
    finally:
        connection.close()


@pytest.mark.parametrize("kind", ["forkserve", "gunicorn"])
def test_https_keep_alive_with_wsgi_url_scheme_https(kind, start, pki):
    server = start(kind)
    answers, name = get(server.port, client_context(pki), "/scheme", count=3)
    assert answers == [(200, "https")] * 3 and name == "first"


def test_curl_over_tls(start, pki):
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed")
    server = start("forkserve")
    result = subprocess.run(["curl", "-sS", "--cacert", os.path.join(pki, "ca.pem"),
                             f"https://localhost:{server.port}/scheme",
                             f"https://localhost:{server.port}/echo", "-d", "posted body"],
                            capture_output=True, timeout=30)
    assert result.returncode == 0 and result.stdout == b"httpsposted body", result


def raw_tls(port, pki, data, cert=None):
    """Send `data` over TLS and read until the server closes or 5 s pass."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        with client_context(pki, cert).wrap_socket(sock, server_hostname="localhost") as tls:
            tls.sendall(data)
            received = b""
            try:
                while True:
                    chunk = tls.recv(65536)
                    if not chunk:
                        return received
                    received += chunk
            except (TimeoutError, ssl.SSLError, ConnectionResetError):
                return received


@pytest.mark.parametrize("kind", ["forkserve", "gunicorn"])
def test_plain_http_to_a_tls_port_gets_no_http_answer(kind, start):
    server = start(kind)
    for _ in range(5):
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
            sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            try:
                answer = sock.recv(65536)
            except ConnectionResetError:
                answer = b""
            assert not answer.startswith(b"HTTP/"), answer
    if kind == "forkserve":  # the failures, logged once: not a line per connection
        poll(lambda: "TLS handshake with 127.0.0.1 failed" in server.log(),
             message="the handshake failure line")
        assert server.log().count("TLS handshake") == 1, server.log()
        assert "plain HTTP" in server.log()


def test_http_strictness_and_limits_are_the_same_behind_tls(start, pki):
    server = start("forkserve", "--limit-request-line", "100", "--header-timeout", "1")
    conflicting = raw_tls(server.port, pki, b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n")
    assert conflicting.startswith(b"HTTP/1.1 400 "), conflicting
    long_line = raw_tls(server.port, pki, b"GET /" + b"a" * 200 + b" HTTP/1.1\r\nHost: a\r\n\r\n")
    assert long_line.startswith(b"HTTP/1.1 414 "), long_line
    smuggled = raw_tls(server.port, pki, b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n"
                       b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
    assert smuggled.startswith(b"HTTP/1.1 400 "), smuggled
    # half a head, then silence: 408 at header_timeout, as without TLS
    started = time.monotonic()
    slow = raw_tls(server.port, pki, b"GET / HTTP/1.1\r\nHost: a\r\n")
    assert slow.startswith(b"HTTP/1.1 408 ") and time.monotonic() - started < 4, slow


def test_a_client_that_never_finishes_its_handshake_is_closed_at_the_header_timeout(start):
    server = start("forkserve", "--header-timeout", "1")
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(b"\x16\x03\x01")  # the start of a ClientHello, and no more
        started = time.monotonic()
        assert sock.recv(100) == b""
        assert time.monotonic() - started < 5


@pytest.mark.parametrize("kind", ["forkserve", "gunicorn"])
def test_cert_reqs_2_requires_a_client_certificate_from_ca_certs(kind, start, pki):
    server = start(kind, "--ca-certs", os.path.join(pki, "ca.pem"), "--cert-reqs", "2")
    assert get(server.port, client_context(pki, "client"), "/scheme")[0] == [(200, "https")]
    for cert in (None, "stranger"):
        with pytest.raises((ssl.SSLError, ConnectionResetError, http.client.HTTPException,
                            BrokenPipeError)):
            get(server.port, client_context(pki, cert), "/scheme")


@pytest.mark.parametrize("kind", ["forkserve", "gunicorn"])
def test_after_hup_a_new_connection_gets_the_replaced_certificate(kind, start, pki, tmp_path):
    server = start(kind)
    assert get(server.port, client_context(pki))[1] == "first"
    shutil.copy(os.path.join(pki, "server2.pem"), tmp_path / "cert.pem")
    shutil.copy(os.path.join(pki, "server2.key"), tmp_path / "key.pem")
    server.signal(signal.SIGHUP)
    poll(lambda: get(server.port, client_context(pki))[1] == "second", timeout=60,
         message="the replaced certificate")


@pytest.mark.parametrize("files, named", [
    (("--certfile", "missing.pem"), "missing.pem: no such file"),
    (("--certfile", "{pki}/server.pem", "--keyfile", "{pki}/client.key"),
     "check that the key matches the certificate"),
])
def test_bad_tls_files_stop_the_start_with_a_message_naming_them(files, named, pki, tmp_path):
    files = [part.format(pki=pki) for part in files]
    result = subprocess.run([sys.executable, "-m", "forkserve", "-b", "127.0.0.1:0", *files,
                             "tls_site:app"], cwd=APPS, capture_output=True, timeout=60)
    assert result.returncode == 2 and named in result.stderr.decode(), result


def test_a_uwsgi_listener_stays_plain_beside_a_tls_one(start, pki):
    from forkserve.http.uwsgi import encode_packet
    server = start("forkserve", "-b", "uwsgi:127.0.0.1:0")
    port = int(re.search(r"Listening at: uwsgi://127\.0\.0\.1:(\d+)", server.log()).group(1))
    packet = encode_packet([("REQUEST_METHOD", "GET"), ("PATH_INFO", "/scheme"),
                            ("QUERY_STRING", ""), ("SERVER_PROTOCOL", "HTTP/1.1"),
                            ("SERVER_NAME", "x"), ("SERVER_PORT", "80"),
                            ("REMOTE_ADDR", "127.0.0.1"), ("UWSGI_SCHEME", "http")])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(packet)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(b"\r\n\r\nhttp"), answer


def test_the_ssl_context_hook_makes_the_context(start, pki, tmp_path):
    config = tmp_path / "tls.conf.py"
    config.write_text(
        "import ssl\n"
        "def ssl_context(config, default_ssl_context_factory):\n"
        "    context = default_ssl_context_factory()\n"
        "    context.minimum_version = ssl.TLSVersion.TLSv1_3\n"
        "    return context\n")
    server = start("forkserve", "-c", str(config))
    old = client_context(pki)
    old.maximum_version = ssl.TLSVersion.TLSv1_2
    with pytest.raises((ssl.SSLError, ConnectionResetError)):
        get(server.port, old)
    assert get(server.port, client_context(pki), "/scheme")[0] == [(200, "https")]


@pytest.mark.parametrize("kind", ["forkserve", "gunicorn"])
def test_a_gunicorn_config_with_tls_statsd_syslog_and_daemon_does_what_gunicorn_does(
        kind, pki, tmp_path):
    """The issue's target: certfile, keyfile, ca_certs, cert_reqs = 2, statsd_host,
    syslog = True and daemon = True in one Gunicorn config file."""
    if kind == "gunicorn":
        pytest.importorskip("gunicorn")
    from test_daemon_e2e import session_members
    metrics, syslog = (socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(2))
    for listener in (metrics, syslog):
        listener.bind(("127.0.0.1", 0))
        listener.setblocking(False)
    pid_path, log_path = tmp_path / "server.pid", tmp_path / "error.log"
    config = tmp_path / "gunicorn.conf.py"
    config.write_text(f"""
bind = "127.0.0.1:0"
workers = 2
worker_class = "gevent"
certfile = {os.path.join(pki, "server.pem")!r}
keyfile = {os.path.join(pki, "server.key")!r}
ca_certs = {os.path.join(pki, "ca.pem")!r}
cert_reqs = 2
statsd_host = "127.0.0.1:{metrics.getsockname()[1]}"
syslog = True
syslog_addr = "udp://127.0.0.1:{syslog.getsockname()[1]}"
daemon = True
pidfile = {str(pid_path)!r}
errorlog = {str(log_path)!r}
graceful_timeout = 5
""")
    started = subprocess.run([sys.executable, "-m", kind, "-c", str(config), "tls_site:app"],
                             cwd=APPS, timeout=60, stdin=subprocess.DEVNULL, capture_output=True)
    assert started.returncode == 0, started
    found = poll(lambda: log_path.exists() and re.search(
        r"Listening at: https://127\.0\.0\.1:(\d+)", log_path.read_text()), timeout=30,
        message="Listening at: https in the error log")
    port = int(found.group(1))
    master = poll(lambda: pid_path.exists() and pid_path.read_text().strip().isdigit()
                  and int(pid_path.read_text()), message="the pid file")
    sid = os.getsid(master)
    try:
        assert sid not in (os.getsid(0), master)
        answers, _ = get(port, client_context(pki, "client"), "/scheme", count=3)
        assert answers == [(200, "https")] * 3
        with pytest.raises((ssl.SSLError, ConnectionResetError, http.client.HTTPException,
                            BrokenPipeError)):
            get(port, client_context(pki), "/scheme")  # no client certificate
        datagrams, lines = [], []

        def drained(sock, into):
            try:
                while True:
                    into.append(sock.recv(65536).decode("utf-8", "replace"))
            except BlockingIOError:
                return into
        poll(lambda: sum(d.startswith("gunicorn.requests:1|c") for d in
                         drained(metrics, datagrams)) == 3, message="3 requests counted")
        poll(lambda: sum('"GET /scheme HTTP/1.1" 200' in line for line in
                         drained(syslog, lines)) == 3, message="3 access lines in syslog")
        assert any(d.startswith("gunicorn.request.duration:") and d.endswith("|ms")
                   for d in datagrams)
        assert "gunicorn.request.status.200:1|c|@1.0" in datagrams
        assert any(re.match(r"<\d+>gunicorn\.tls_site\.app\.error: \[\d+\] ", line)
                   for line in lines), lines
        os.kill(master, signal.SIGTERM)
        poll(lambda: not session_members(sid), timeout=30, message="every process gone")
        assert not pid_path.exists()
    finally:
        for pid in session_members(sid):
            os.kill(pid, signal.SIGKILL)
        metrics.close()
        syslog.close()
