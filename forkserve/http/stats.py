"""The stats endpoint: memory figures over HTTP, outside the application.

  GET /         the live dashboard, an HTML page (forkserve.http.dashboard)
                that draws /history; the JSON report instead for a client
                that asks for JSON only (Accept: application/json)
  GET /json     the memory report as JSON (forkserve.memory.report_json.to_json);
                ?max_age=SECONDS for figures at most that old (also /metrics)
  GET /history  memory and request rate over time as JSON
                (forkserve.memory.history); ?since=EPOCH for newer points only
  GET /metrics  the same figures in the Prometheus text format
  GET /health   200 once the application is loaded and its workers serve,
                503 while they start or once the server stops: a readiness
                check (Kubernetes, a load balancer) that no application
                route has to provide
  GET /livez    200 whenever the master's loop answers (a liveness check:
                /health says 503 while a crashed generation is replaced)

It is served by `StatsEndpoint` from the loop of the process that holds it
(the master, the single-process server, the supervisor: the wait of
forkserve.process.driver.Driver), with non-blocking sockets and a small
per-connection buffer, so a slow or silent client can never stall worker
supervision; the same turn takes the history's samples when they are due.
A report makes the kernel walk every process's pages, so /json and
/metrics answer with the latest sample (`StatsEndpoint.latest_report`): a
report is read at the history's pace (at most `History.max_share` of the
loop's time), however often the endpoint is scraped; a scrape that gives
`max_age` gets a fresh one sooner (`History.due`).
"""

import json
import socket
import time
import urllib.parse

from forkserve.http import dashboard
from forkserve.http.h1 import Limits, RequestError
from forkserve.http.protocol import NEED_DATA, PEER_CLOSED, Connection, plain_response
from forkserve.memory import render, report_json
from forkserve.memory.history import History

__all__ = ["respond", "sample", "StatsEndpoint"]

#: a stats request head is parsed by forkserve's HTTP/1.1 connection object
#: under these limits (the endpoint reads only GETs): 8 KiB at most
LIMITS = Limits(limit_request_line=4094, limit_request_fields=32,
                limit_request_field_size=4096, limit_request_body=0)
#: seconds a stats client has to send its request and read the answer
CLIENT_TIMEOUT = 5.0
#: connections served at once; more are closed on accept
MAX_CLIENTS = 16

_PROMETHEUS_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _always():
    return True


def respond(method: str, path: str, make_report, ready=_always, *, accept="", history=None):
    """Decide the answer to a stats request: (status line, content type, body bytes).

    `make_report(max_age)` gives the report, at most `max_age` seconds old
    (None: the latest sample's); `ready()` says whether the server serves
    now (GET /health); `accept` is the request's Accept header; `history`
    the History behind /history."""
    path, _, query = path.partition("?")
    if method not in ("GET", "HEAD"):
        return "405 Method Not Allowed", "text/plain", b"only GET is served here\n"
    if path == "/livez":
        return "200 OK", "text/plain", b"alive\n"
    if path == "/health":
        if ready():
            return "200 OK", "text/plain", b"ready\n"
        return "503 Service Unavailable", "text/plain", b"not serving (starting or stopping)\n"
    wants_json = path == "/json" or path == "/" and _wants_json_only(accept)
    if wants_json or path == "/metrics":
        try:
            max_age = _seconds(query, "max_age")
        except ValueError:
            return ("400 Bad Request", "text/plain",
                    b"max_age= takes seconds, as in /json?max_age=2\n")
        report = make_report(max_age)
        if wants_json:
            body = json.dumps(report_json.to_json(report), indent=1).encode() + b"\n"
            return "200 OK", "application/json", body
        return "200 OK", _PROMETHEUS_TYPE, render.to_prometheus(report).encode()
    if path == "/":
        return "200 OK", "text/html; charset=utf-8", dashboard.page()
    if path == "/history":
        return _history(query, history or History())
    return ("404 Not Found", "text/plain",
            b"forkserve stats: try / (the dashboard), /json (the report), /history, "
            b"/metrics (Prometheus) or /health\n")


def _wants_json_only(accept):
    types = {part.split(";", 1)[0].strip().lower() for part in accept.split(",")}
    return "application/json" in types and "text/html" not in types


def _seconds(query, name):
    """The number `name=` gives in the query string, or None (ValueError
    if it is not a number)."""
    value = urllib.parse.parse_qs(query).get(name)
    return float(value[0]) if value else None


def _history(query, history):
    try:
        since = _seconds(query, "since")
    except ValueError:
        return ("400 Bad Request", "text/plain",
                b"since= takes epoch seconds, as in /history?since=1764100000.5\n")
    body = json.dumps(history.to_json(since), separators=(",", ":")).encode()
    return "200 OK", "application/json", body


def sample(history, make_report, clock=time.monotonic, cpu_clock=time.process_time,
           max_age=None):
    """Add a report to the history if one is due (cheap when not); see
    History.due for `max_age`. Its cost is the CPU time it took this
    process, whatever the load (see forkserve.memory.history)."""
    started = clock()
    if history.due(started, max_age):
        spent = cpu_clock()
        history.add(make_report())
        history.sampled(started, cpu_clock() - spent)


def _http_response(method, path, make_report, ready, accept, history) -> bytes:
    status, content_type, body = respond(method, path, make_report, ready, accept=accept,
                                         history=history)
    return plain_response(status, body, content_type, head_request=method == "HEAD")


class _Client:
    __slots__ = ("sock", "http", "outbuf", "deadline")

    def __init__(self, sock, now):
        self.sock = sock
        self.http = Connection(LIMITS)
        self.outbuf = b""
        self.deadline = now + CLIENT_TIMEOUT


class StatsEndpoint:
    """Serves stats from a select() loop. The loop calls `service()` every turn."""

    def __init__(self, listener: socket.socket, history=None, *, clock=time.monotonic):
        self.listener = listener
        self.listener.setblocking(False)
        self.clients = {}
        self.history = History() if history is None else history
        self.clock = clock

    def filenos(self):
        return [self.listener.fileno()] + [fd for fd, c in self.clients.items() if not c.outbuf]

    def writable_filenos(self):
        return [fd for fd, client in self.clients.items() if client.outbuf]

    def all_filenos(self):
        return [self.listener.fileno()] + list(self.clients)

    def latest_report(self, make_report, max_age=None):
        """The latest sample's report; `make_report()` read (and added to the
        history) first if a sample is due (see History.due for `max_age`)."""
        sample(self.history, make_report, self.clock, max_age=max_age)
        return self.history.latest

    def service(self, readable, writable, make_report, ready=_always):
        """Serve the clients found ready; `make_report()` reads a report now
        (taken as a sample when one is due)."""
        sample(self.history, make_report, self.clock)
        if self.listener.fileno() in readable:
            self._accept()
        for fd in list(self.clients):
            client = self.clients[fd]
            if fd in readable and not client.outbuf:
                self._read(client, make_report, ready)
            elif fd in writable and client.outbuf:
                self._write(client)
        now = self.clock()
        for fd, client in list(self.clients.items()):
            if now > client.deadline:
                self._close(client)

    def _accept(self):
        while True:
            try:
                sock, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue
            if len(self.clients) >= MAX_CLIENTS:
                sock.close()
                continue
            sock.setblocking(False)
            self.clients[sock.fileno()] = _Client(sock, self.clock())

    def _read(self, client, make_report, ready):
        try:
            data = client.sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except ConnectionError:
            data = b""
        http = client.http
        http.receive_data(data)
        try:
            request = http.next_event()
        except RequestError as refused:
            client.outbuf = http.refusal(refused.status)
        else:
            if request is NEED_DATA:
                return
            if request is PEER_CLOSED:
                self._close(client)
                return
            def report(max_age):
                return self.latest_report(make_report, max_age)
            client.outbuf = _http_response(request.method, request.target, report, ready,
                                           request.headers.get("HTTP_ACCEPT", ""), self.history)
        self._write(client)

    def _write(self, client):
        try:
            sent = client.sock.send(client.outbuf)
        except (BlockingIOError, InterruptedError):
            return
        except ConnectionError:
            self._close(client)
            return
        client.outbuf = client.outbuf[sent:]
        if not client.outbuf:
            self._close(client)

    def _close(self, client):
        self.clients.pop(client.sock.fileno(), None)
        client.sock.close()
