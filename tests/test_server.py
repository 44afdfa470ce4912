"""forkserve.http.server: the environ, TCP_NODELAY, the counters, drain() and close_now()."""

import json
import signal
import socket
import time
from contextlib import ExitStack

import pytest

import forkserve
from forkserve.http.server import needs_nodelay
from httpclient import Reader, fresh_server, is_closed, read_response, wait_closed  # noqa: F401
from httpcorpus import request

e2e = pytest.mark.e2e


def test_needs_nodelay_only_when_accepted_sockets_would_lack_it():
    with socket.socket() as plain, socket.socket() as tuned, \
            socket.socket(socket.AF_UNIX) as unix:
        tuned.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        assert needs_nodelay(plain)
        assert not needs_nodelay(tuned)  # Linux copies it to accepted sockets
        assert not needs_nodelay(unix)


def counters(live):
    return json.loads(live.get("/counters").body)


def wait_for_active(live, count, timeout=5):
    """Poll until `count` requests besides the polling one are in flight."""
    deadline = time.monotonic() + timeout
    while counters(live)["active"] < count + 1:
        assert time.monotonic() < deadline, "requests never became active"
        time.sleep(0.02)


@e2e
def test_environ_names_the_bound_address_and_flags_concurrency(fresh_server):
    live = fresh_server()
    reply = live.get("/environ", "Cookie: a=1\r\nCookie: b=2\r\nX-A: 1\r\nX-A: 2\r\n"
                                 "X_Forwarded_For: spoof\r\nContent-Type: text/x\r\n")
    env = json.loads(reply.body)
    assert env["SERVER_NAME"] == "127.0.0.1" and env["SERVER_PORT"] == str(live.port)
    assert env["SERVER_SOFTWARE"] == f"forkserve/{forkserve.__version__}"
    assert env["wsgi.multithread"] is True and env["wsgi.multiprocess"] is True
    assert env["REMOTE_ADDR"] == "127.0.0.1"
    assert env["HTTP_COOKIE"] == "a=1; b=2" and env["HTTP_X_A"] == "1,2"
    assert env["CONTENT_TYPE"] == "text/x" and "HTTP_CONTENT_TYPE" not in env
    assert "HTTP_X_FORWARDED_FOR" not in env  # underscored names are dropped


@e2e
def test_a_head_seen_before_gives_the_same_environ_and_the_same_refusals(fresh_server):
    # The second and third heads are parsed from the handler's line memos
    # (forkserve.http.handler._REQUEST_LINES, _FIELD_LINES): what the
    # application sees, and what is refused, must not change.
    live = fresh_server(keep_alive=10)
    head = request("GET /environ/a%20b?q=1 HTTP/1.1",
                   ("Host: t", "X_Forwarded_For: spoof", "Cookie: a=1", "Cookie: b=2"))
    with live.connect() as sock:
        envs = []
        for _ in range(3):
            sock.sendall(head)
            envs.append(json.loads(read_response(sock).body))
    assert envs[0] == envs[1] == envs[2]
    assert envs[0]["PATH_INFO"] == "/environ/a b" and envs[0]["QUERY_STRING"] == "q=1"
    assert "HTTP_X_FORWARDED_FOR" not in envs[0] and envs[0]["HTTP_COOKIE"] == "a=1; b=2"
    with live.connect() as sock:  # a known line does not excuse a second Host
        sock.sendall(request("GET /environ/a%20b?q=1 HTTP/1.1", ("Host: t", "Host: t")))
        assert read_response(sock).status == 400


@e2e
def test_absolute_form_target_becomes_path_info(fresh_server):
    env = json.loads(fresh_server().get("http://example.com/environ/a%20b?x=1").body)
    assert env["PATH_INFO"] == "/environ/a b" and env["QUERY_STRING"] == "x=1"


@e2e
def test_accepted_tcp_connections_get_nodelay_when_the_listener_lacks_it(fresh_server):
    assert fresh_server().get("/nodelay").body == b"1"


@e2e
def test_unix_socket_listener_serves_with_configured_server_name(fresh_server, tmp_path):
    live = fresh_server(unix=tmp_path / "s.sock", server_name="example.test")
    env = json.loads(live.get("/environ").body)
    assert (env["SERVER_NAME"], env["SERVER_PORT"]) == ("example.test", "")
    assert "REMOTE_ADDR" not in env


@e2e
def test_counters_report_active_requests_open_connections_and_completed_responses(fresh_server):
    live = fresh_server(keep_alive=10)
    with live.connect() as first, live.connect() as second:
        for sock in (first, second):
            sock.sendall(request())
            assert read_response(sock).status == 200
        assert counters(live) == {"active": 1, "open": 3, "completed": 2}
        assert live.get("/boom").status == 500
        assert counters(live)["completed"] == 2 + 1 + 1  # the first /counters and /boom too


@e2e
def test_drain_refuses_to_run_inside_a_connection_greenlet(fresh_server):
    body = fresh_server().get("/drain-inside").body
    assert b"gevent.spawn(server.drain, timeout)" in body


@e2e
def test_drain_answers_in_flight_and_next_requests_with_close_and_idle_ones_close_after_keep_alive(
        fresh_server):
    live = fresh_server(keep_alive=1.5, header_timeout=10, drain_timeout=8)
    with ExitStack() as stack:
        idle, quiet, fresh, streaming, waiting, piped = (
            stack.enter_context(live.connect()) for _ in range(6))
        for sock in (idle, quiet):
            sock.sendall(request())
            assert read_response(sock).status == 200
        # fresh: connected but has not sent its request yet
        streaming.sendall(request("GET /slow?chunks=5&delay=0.2 HTTP/1.1"))  # body under way
        waiting.sendall(request("GET /slow-start?delay=0.6 HTTP/1.1"))  # no response yet
        # piped: two requests sent together; both are answered, the second says close
        piped.sendall(request("GET /slow-start?delay=0.6 HTTP/1.1") + request())
        wait_for_active(live, 3)

        started = time.monotonic()
        live.signal(signal.SIGTERM)
        poll_refused = time.monotonic() + 2
        while True:  # the listener closes at once
            try:
                live.connect().close()
            except ConnectionRefusedError:
                break
            assert time.monotonic() < poll_refused, "still accepting while draining"
            time.sleep(0.02)

        # an idle keep-alive connection is not cut: its next request is answered, with close
        idle.sendall(request())
        reply = read_response(idle)
        assert (reply.status, reply.headers["connection"]) == (200, "close")
        assert is_closed(idle)
        fresh.sendall(request())
        reply = read_response(fresh)
        assert (reply.status, reply.headers["connection"]) == (200, "close")
        assert is_closed(fresh)
        reply = read_response(streaming)  # its head went out before the drain
        assert (reply.status, reply.body, reply.complete) == (200, b"chunk0chunk1chunk2chunk3chunk4", True)
        reply = read_response(waiting)
        assert (reply.status, reply.body, reply.headers["connection"]) == (200, b"done", "close")
        assert is_closed(waiting)
        reader = Reader(piped)
        first, second = read_response(piped, reader), read_response(piped, reader)
        assert (first.status, first.body, "connection" in first.headers) == (200, b"done", False)
        assert (second.status, second.headers["connection"]) == (200, "close")
        assert is_closed(piped)
        # a connection that stays idle closes after keep_alive, not at once
        closed_after = time.monotonic() - started + wait_closed(quiet, 4)
        assert 1.0 < closed_after < 3.5, closed_after
        assert is_closed(streaming)

    drained = live.read_line("DRAINED", deadline=started + 10).split()
    assert drained[1] == "True" and float(drained[2]) < 5
    assert live.proc.wait(timeout=5) == 0


@e2e
def test_drain_closes_what_remains_when_its_timeout_expires(fresh_server):
    live = fresh_server(drain_timeout=0.5)
    with live.connect() as sock:
        sock.sendall(request("GET /slow?chunks=50&delay=0.1 HTTP/1.1"))
        wait_for_active(live, 1)
        started = time.monotonic()
        live.signal(signal.SIGTERM)
        drained = live.read_line("DRAINED", deadline=started + 3).split()
        assert drained[1] == "False" and float(drained[2]) < 1.0
        reply = read_response(sock)
        assert not reply.complete and is_closed(sock, 1)


@e2e
def test_close_now_closes_every_connection_at_once(fresh_server):
    live = fresh_server(keep_alive=10)
    with live.connect() as idle, live.connect() as busy:
        idle.sendall(request())
        assert read_response(idle).status == 200
        busy.sendall(request("GET /slow?chunks=50&delay=0.1 HTTP/1.1"))
        wait_for_active(live, 1)
        started = time.monotonic()
        live.signal(signal.SIGINT)
        live.read_line("CLOSED", deadline=started + 2)
        assert wait_closed(idle, 1) is not None
        reader = Reader(busy)
        try:
            while reader.fill():
                pass
        except ConnectionResetError:
            pass
        assert time.monotonic() - started < 1.5
        assert reader.buf.count(b"chunk") < 50


# --- the master's stats endpoint parses with the same HTTP/1.1 connection object ---

def _stats_answer(raw):
    import select
    from forkserve.http.stats import StatsEndpoint
    from forkserve.memory.model import Report
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    endpoint = StatsEndpoint(listener)
    client = socket.create_connection(listener.getsockname(), timeout=5)
    try:
        client.sendall(raw)
        client.shutdown(socket.SHUT_WR)
        received = b""
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            readable, writable, _ = select.select(endpoint.filenos(), endpoint.writable_filenos(),
                                                  [], 0.05)
            endpoint.service(readable, writable, lambda: Report((), time.time()), lambda: True)
            ready, _, _ = select.select([client], [], [], 0)
            if ready:
                data = client.recv(65536)
                if not data:
                    return received
                received += data
        raise AssertionError(f"no complete answer from the stats endpoint: {received!r}")
    finally:
        client.close()
        listener.close()


def test_stats_endpoint_reads_requests_with_the_servers_http_parser():
    assert _stats_answer(b"GET /livez HTTP/1.1\r\nHost: s\r\n\r\n").startswith(b"HTTP/1.1 200 ")
    assert _stats_answer(b"GET /livez?x=1 HTTP/1.0\r\n\r\n").endswith(b"alive\n")
    # what split(b"\r\n") let through: the parser's rules refuse it
    for raw in (b"GET /livez HTTP/1.1\r\n\r\n",                 # no Host
                b"GET /livez HTTP/1.1\nHost: s\n\n",             # bare LF
                b"GET /livez HTTP/1.1\r\nHost: s\r\nX : y\r\n\r\n"):
        assert _stats_answer(raw).startswith(b"HTTP/1.1 400 "), raw


# --- the accept path: passes of the loop, the worker's cap, stop_accepting from the hub ---

def _hello(environ, start_response):
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", "2")])
    return [b"ok"]


def _in_process_server(**kwargs):
    from gevent import socket as gsocket

    from forkserve.http.server import Server
    listener = gsocket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    return listener, Server(listener, _hello, **kwargs)


def _answer(client):
    """Everything `client` receives until the server closes it."""
    received = b""
    while True:
        data = client.recv(65536)
        if not data:
            return received
        received += data


def test_connections_waiting_together_are_served_over_several_passes_and_stop_accepting_never_switches():
    import gevent
    from gevent import socket as gsocket
    listener, server = _in_process_server()
    server.pass_seconds = 0  # one connection a pass: the loop polls between them
    clients = [gsocket.create_connection(listener.getsockname(), timeout=5) for _ in range(5)]
    for client in clients:
        client.sendall(b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
    server.start()
    try:
        for client in clients:
            answer = _answer(client)
            assert answer.startswith(b"HTTP/1.1 200 OK\r\n") and answer.endswith(b"\r\n\r\nok")
        stopped = gevent.event.Event()

        def stop():  # in the hub: a switch here would raise BlockingSwitchOutError
            server.stop_accepting()
            stopped.set()
        gevent.get_hub().loop.run_callback(stop)
        assert stopped.wait(5) and server.closed and listener.fileno() == -1
    finally:
        for client in clients:
            client.close()
        server.close_now()


def test_a_worker_at_its_connection_cap_takes_the_next_one_when_one_ends():
    import gevent
    from gevent import socket as gsocket
    listener, server = _in_process_server(worker_connections=1)
    server.start()
    first = gsocket.create_connection(listener.getsockname(), timeout=5)
    second = gsocket.create_connection(listener.getsockname(), timeout=5)
    try:
        first.sendall(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")  # kept alive: holds the one place
        assert first.recv(65536).endswith(b"\r\n\r\nok")
        second.sendall(b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        answered = gevent.spawn(_answer, second)
        # the second waits in the listen queue while the first is open
        assert gevent.wait([answered], timeout=0.3) == []
        assert server.open_connections == 1
        first.close()
        assert answered.get(timeout=5).endswith(b"\r\n\r\nok")
    finally:
        first.close()
        second.close()
        server.close_now()
