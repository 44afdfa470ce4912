"""A real nginx with `uwsgi_pass` and its own stock `include uwsgi_params`
in front of a real forkserve speaking uwsgi, over TCP and over a unix socket:
GET, POST bodies (buffered, unbuffered, chunked by the client), large
responses with and without a length, and the client's keep-alive."""

import hashlib
import json
import pathlib
import re
import shutil
import socket
import tempfile

import pytest

from deploy_cluster import Nginx, require_nginx, uwsgi_params
from forkserve.http.uwsgi import encode_packet
from forkserve_testing import ServerProcess, poll

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

APPS = pathlib.Path(__file__).resolve().parent / "apps"
UWSGI_LISTENING = re.compile(r"Listening at: uwsgi://127\.0\.0\.1:(\d+)")


def wait_uwsgi_port(server):
    def listening():
        if server.proc.poll() is not None:
            raise AssertionError(f"server exited with {server.proc.returncode}:\n{server.log()}")
        match = UWSGI_LISTENING.search(server.log())
        return match and int(match.group(1))
    return poll(listening, 30, message="the uwsgi Listening at: line")


@pytest.fixture(scope="module")
def site():
    """(nginx, server, port): forkserve on uwsgi TCP and unix listeners, nginx in front."""
    require_nginx(pytest)
    # nginx's workers run as nobody, who cannot enter pytest's 0700 directories
    # (the app's socket, nginx's temp files for request bodies)
    directory = pathlib.Path(tempfile.mkdtemp(prefix="forkserve-uwsgi-"))
    directory.chmod(0o755)
    sock_path = directory / "app.sock"
    shutil.copy(uwsgi_params(), directory / "uwsgi_params")
    server = ServerProcess(["-w", "2", "-b", f"uwsgi:unix:{sock_path}"], app="uwsgi_site:app",
                           cwd=APPS, log_dir=directory, bind="uwsgi:127.0.0.1:0")
    nginx = None
    try:
        port = wait_uwsgi_port(server)
        poll(lambda: sock_path.exists(), 10, message="the unix socket")

        def config(listen):
            locations = "".join(
                f"  location /{name}/ {{ include {directory}/uwsgi_params; "
                f"uwsgi_pass {upstream}; {extra} }}\n"
                for name, upstream, extra in (
                    ("tcp", "fs_tcp", ""), ("unix", f"unix:{sock_path}", ""),
                    ("unbuffered", "fs_tcp", "uwsgi_request_buffering off; "
                                             "uwsgi_buffering off;")))
            return ("upstream fs_tcp { server 127.0.0.1:%d; keepalive 8; }\n"
                    "server {\n  client_max_body_size 20m;\n" % port
                    + "".join(f"  listen {address};\n" for address in listen)
                    + "  location = / { return 404; }\n" + locations + "}\n")
        nginx = Nginx(directory, config).start()
        yield nginx, server, port
    finally:
        if nginx is not None:
            nginx.stop()
        server.kill_group()
        shutil.rmtree(directory, ignore_errors=True)


def call(nginx, method, path, body=None, headers=None, connection=None):
    own = connection is None
    connection = connection or nginx.connection()
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        if own:
            connection.close()


@pytest.mark.parametrize("via", ["tcp", "unix"])
def test_get_through_uwsgi_pass_sees_the_request_nginx_got(site, via):
    nginx, _, _ = site
    status, _, body = call(nginx, "GET", f"/{via}/caf%C3%A9/x?a=1&b=%20",
                           headers={"Cookie": "s=1", "X-Tag": "t", "User-Agent": "probe/1"})
    assert status == 200, body
    env = json.loads(body)
    assert env["PATH_INFO"] == f"/{via}/café/x".encode().decode("latin-1")
    assert env["QUERY_STRING"] == "a=1&b=%20"
    assert env["REQUEST_URI"] == f"/{via}/caf%C3%A9/x?a=1&b=%20"
    assert env["HTTP_COOKIE"] == "s=1" and env["HTTP_X_TAG"] == "t"
    assert env["HTTP_USER_AGENT"] == "probe/1" and env["HTTP_HOST"] == "localhost"
    assert env["SERVER_PROTOCOL"] == "HTTP/1.1" and env["REQUEST_METHOD"] == "GET"
    assert env["REMOTE_ADDR"] == "unix:"  # nginx's $remote_addr: the client is on its unix socket
    assert env["wsgi.url_scheme"] == "http" and env["CONTENT_LENGTH"] in (None, "")


@pytest.mark.parametrize("via", ["tcp", "unix", "unbuffered"])
def test_post_body_arrives_whole(site, via):
    nginx, _, _ = site
    body = bytes(range(256)) * 4096 + b"end"  # 1 MiB and a bit
    status, _, answer = call(nginx, "POST", f"/{via}/upload", body=body,
                             headers={"Content-Type": "application/octet-stream"})
    assert status == 200, answer
    env = json.loads(answer)
    assert env["body_length"] == len(body) and env["CONTENT_LENGTH"] == str(len(body))
    assert env["body_sha1"] == hashlib.sha1(body).hexdigest()
    assert env["CONTENT_TYPE"] == "application/octet-stream"


@pytest.mark.parametrize("via", ["tcp", "unbuffered"])
def test_a_chunked_client_body_reaches_the_app_with_its_length(site, via):
    nginx, _, _ = site
    parts = [b"a" * 1000, b"b" * 70000, b"c"]
    connection = nginx.connection()
    try:
        connection.request("POST", f"/{via}/chunked", body=iter(parts), encode_chunked=True,
                           headers={"Transfer-Encoding": "chunked"})
        response = connection.getresponse()
        env = json.loads(response.read())
    finally:
        connection.close()
    whole = b"".join(parts)
    assert response.status == 200
    assert env["body_length"] == len(whole) and env["CONTENT_LENGTH"] == str(len(whole))
    assert env["body_sha1"] == hashlib.sha1(whole).hexdigest()


@pytest.mark.parametrize("path", ["big", "big-length"])
@pytest.mark.parametrize("via", ["tcp", "unix"])
def test_large_response_arrives_whole_with_or_without_a_length(site, via, path):
    nginx, _, _ = site
    size = 5 * 1024 * 1024 + 17
    status, _, body = call(nginx, "GET", f"/{via}/{path}?{size}")
    assert status == 200 and len(body) == size
    block = bytes(range(256)) * 256
    assert body == (block * (size // len(block) + 1))[:size]


def test_keep_alive_clients_are_served_request_after_request(site):
    """nginx keeps the client's connection; each uwsgi request gets its own
    upstream connection, which forkserve closes after the response."""
    nginx, server, _ = site
    connection = nginx.connection()
    try:
        for number in range(60):
            via = ("tcp", "unix")[number % 2]
            post = bool(number % 3)
            status, headers, body = call(nginx, "POST" if post else "GET",
                                         f"/{via}/n{number}",
                                         body=b"x" * number if post else None,
                                         connection=connection)
            assert status == 200 and json.loads(body)["body_length"] == (
                number if number % 3 else 0)
            assert headers.get("Connection", "keep-alive") == "keep-alive"
        first_socket = connection.sock
        call(nginx, "GET", "/tcp/again", connection=connection)
        assert connection.sock is first_socket  # the client's connection was kept
    finally:
        connection.close()
    assert "upstream prematurely closed" not in nginx.log()
    assert "refused request" not in server.log()


def test_http_sent_to_the_uwsgi_listener_is_refused_and_logged(site):
    _, server, port = site
    with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
        client.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = b""
        while chunk := client.recv(4096):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 400 Bad Request\r\n")
    poll(lambda: "looks like HTTP" in server.log(), 10, message="the refusal in the log")


def _exchange(port, data):
    """What the server answered `data` with until it closed (b"" if it reset
    the connection: a refused peer's unread packet makes the close a reset)."""
    answer = b""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
        try:
            client.sendall(data)
            while chunk := client.recv(65536):
                answer += chunk
        except ConnectionResetError:
            pass
    return answer


def test_a_packet_with_a_10000_byte_var_name_is_refused(site):
    _, server, port = site
    for key in ("N" * 10000, "HTTP_" + "N" * 10000):
        answer = _exchange(port, encode_packet([("REQUEST_METHOD", "GET"), ("REQUEST_URI", "/"),
                                                ("HTTP_HOST", "h"), (key, "v")]))
        assert answer == b"" or answer.startswith(b"HTTP/1.1 431 "), answer[:200]
    poll(lambda: server.log().count("over 8190 bytes") >= 2, 10, message="both refusals logged")


def test_gunicorn_s_protocol_flag_and_uwsgi_allow_from(tmp_path):
    """--protocol uwsgi makes a plain bind address speak uwsgi (as Gunicorn's);
    --uwsgi-allow-from closes connections from peers not listed."""
    packet = encode_packet([("REQUEST_METHOD", "GET"), ("REQUEST_URI", "/x?y=1"),
                            ("PATH_INFO", "/x"), ("QUERY_STRING", "y=1"),
                            ("SERVER_PROTOCOL", "HTTP/1.1"), ("HTTP_HOST", "example.com"),
                            ("REMOTE_ADDR", "203.0.113.7")])
    servers = []
    try:
        for allow in ("127.0.0.1", "192.0.2.1"):
            server = ServerProcess(["-w", "0", "--protocol", "uwsgi", "--uwsgi-allow-from", allow],
                                   app="uwsgi_site:app", cwd=APPS, log_dir=tmp_path)
            servers.append(server)
            port = wait_uwsgi_port(server)
            answer = _exchange(port, packet)
            if allow == "127.0.0.1":
                head, _, body = answer.partition(b"\r\n\r\n")
                assert head.startswith(b"HTTP/1.1 200 OK\r\n") and b"Connection: close" in head
                env = json.loads(body)
                assert (env["PATH_INFO"], env["REMOTE_ADDR"]) == ("/x", "203.0.113.7")
            else:
                assert answer == b""
                poll(lambda: "refused a uwsgi connection from 127.0.0.1" in server.log(), 10,
                     message="the refusal in the log")
    finally:
        for server in servers:
            server.kill_group()
