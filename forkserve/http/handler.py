"""HTTP/1.x request handling for a forkserve worker: limits, strict parsing,
timeouts and the access log, on top of gevent's WSGIHandler.

Invariants, and why:

- The application sees a request only after its request line and every header
  field matched the RFC 9112 grammar and its body framing is unambiguous
  (Content-Length xor chunked, exactly once). Anything else is refused with a
  4xx/5xx and the connection is closed: a proxy in front may have framed the
  same bytes differently, and whatever we read next could be a smuggled request.
- A refused connection is never read from again as HTTP. Its close lingers
  briefly (LINGER_SECONDS) so the client reads the error instead of a reset.
- A connection is reused only if the request body was consumed to its exact
  end and the response was framed exactly (Content-Length kept, or chunked).
- Timers bound the time before a request arrives: the header timer runs from
  the connection's start (first request) or the request's first byte (later
  requests) until the last header line; the idle timer runs between requests.
  Neither runs while the application does, so they never interrupt it.
- Parsing rules are pure functions of bytes (request_line, header_field,
  body_framing, chunk_size), so unit tests drive them without sockets; they
  live in forkserve.http.h1 with the request body reader, and are re-exported here.
"""

import logging
import time
from socket import SHUT_RDWR, SHUT_WR
from urllib.parse import unquote

from gevent import getcurrent
from gevent import Timeout
from gevent.pywsgi import WSGIHandler

from forkserve.http.h1 import (  # the grammar; re-exported names are in __all__
    _ABSOLUTE, _Expired, BLANK_LINES, Body, body_framing,
    chunk_size, ClientDisconnected, escape, GONE_ERRNOS, header_field,
    Limits, LINGER_BYTES, LINGER_SECONDS, REASONS, request_line,
    RequestError,
)

__all__ = ["Limits", "Handler", "RequestError", "ClientDisconnected",
           "request_line", "header_field", "body_framing", "chunk_size", "escape"]

# --- The handler ------------------------------------------------------------

IDLE, HEAD, BUSY, CLOSING = "idle", "head", "busy", "closing"


class Handler(WSGIHandler):
    """Serves one connection: a loop of read head -> run app -> respond.

    Reuses gevent's start_response/write (validation, header encoding) and
    replaces the request side. `state` is IDLE while waiting for a request
    (drain closes such connections at once), HEAD while reading one, BUSY
    while the application runs and the response is sent.
    """

    state = IDLE
    body = None
    requestline = ""
    _body_sent = 0
    _cl_left = None
    _no_body = False
    _linger = False
    _proxy_info = None
    _started = 0.0

    def __init__(self, sock, address, server):
        super().__init__(sock, address, server)
        self.application = server.application
        self._greenlet = getcurrent()
        self._head_timer = _timer(server.loop, server.limits.header_timeout)
        self._idle_timer = _timer(server.loop, server.limits.keep_alive)

    # -- connection loop

    def handle(self):
        try:
            first = True
            while self._next_request(first):
                first = False
        except ClientDisconnected:
            pass
        finally:
            self.state = CLOSING
            for timer in (self._head_timer, self._idle_timer):
                if timer is not None:
                    timer.close()
            self._close()

    def _next_request(self, first):
        """Read, run and answer one request; True if the connection stays open."""
        server = self.server
        env = self._read_request(first)
        if env is None:
            return False
        self.state = BUSY
        server.active_requests += 1
        try:
            self._respond(env)
        finally:
            server.active_requests -= 1
        if server.on_request is not None:
            try:
                server.on_request()
            except Exception:
                server.logger.exception("on_request callback failed")
        if server.access_log is not None:
            self._log_access()
        body = self.body
        if body.error is not None:
            if isinstance(body.error, RequestError):
                self._log_refusal(body.error)
                self._linger = True
            return False
        if self.close_connection or server.draining:
            self._linger = not body.done
            return False
        self.state = HEAD  # discarding a body is still part of this request
        kept = self._bounded(self._head_timer, body.finish)
        self._linger = not kept
        return kept and not server.draining

    def _read_request(self, first):
        """Wait for a request and read its head; returns the environ, or None
        if the connection should close (EOF, timeout, refusal, draining)."""
        self.state = IDLE if not first else HEAD  # see close_if_idle
        if self.server.draining and not first:
            return None
        rfile = self.rfile
        started = b""
        try:
            try:
                if first:
                    self._arm(self._head_timer)
                    started = rfile.peek(1)
                else:
                    self._arm(self._idle_timer)
                    started = rfile.peek(1)
                    self._disarm(self._idle_timer)
                    self._arm(self._head_timer)
                if not started:
                    return None
                self.state = HEAD
                self._started = time.perf_counter()
                if first:  # a PROXY protocol header comes before the first request
                    self._proxy_info = self.server.proxy.read_header(rfile, self.client_address)
                return self._read_head()
            finally:
                self._disarm(self._head_timer)
                self._disarm(self._idle_timer)
        except _Expired:
            if started:  # quiet close unless part of a request arrived
                self._log_refusal(RequestError(408, "request head not received in time"))
                self._send_raw(408)
            return None
        except RequestError as ex:
            self._log_refusal(ex)
            self._send_raw(ex.status)
            self._linger = True
            return None
        except OSError as ex:
            if ex.errno in GONE_ERRNOS:
                return None
            raise

    def _read_head(self):
        server = self.server
        limits = server.limits
        readline = self.rfile.readline
        line_max = limits.line_max
        line = readline(line_max + 2)
        for _ in range(BLANK_LINES):
            if line != b"\r\n":
                break
            line = readline(line_max + 2)
        parsed = request_line(line, line_max)
        if parsed is None:
            return None
        method, target, version = self.command, self.path, self.request_version = parsed
        self.requestline = line[:-2].decode("latin-1")

        env = server.get_environ()
        env["REQUEST_METHOD"] = method
        env["SERVER_PROTOCOL"] = version
        if target[0] != "/":
            match = _ABSOLUTE.match(target)
            if match is None:
                raise RequestError(400, "request target must be a path or an absolute http(s) URL")
            target = target[match.end():] or "/"
            if target[0] == "?":
                target = "/" + target
        path, _, query = target.partition("?")
        env["PATH_INFO"] = unquote(path, "latin-1") if "%" in path else path
        env["QUERY_STRING"] = query
        address = self.client_address
        if isinstance(address, tuple):
            env["REMOTE_ADDR"] = address[0]
            env["REMOTE_PORT"] = str(address[1])

        size_max = limits.field_size_max
        content_lengths = []
        hosts = 0
        for _ in range(limits.fields_max + 1):
            line = readline(size_max + 2)
            if line == b"\r\n":
                break
            field = header_field(line, size_max)
            if field is None:
                return None
            name, value = field
            if "_" in name:
                continue  # dropped, like gevent: X_Forwarded_For must not pose as X-Forwarded-For
            key = name.upper().replace("-", "_")
            if key == "CONTENT_LENGTH":
                content_lengths.append(value)
                env["CONTENT_LENGTH"] = value
                continue
            if key == "CONTENT_TYPE":
                env["CONTENT_TYPE"] = value
                continue
            if key == "HOST":
                hosts += 1
            key = "HTTP_" + key
            if key in env:
                env[key] += ("; " if key == "HTTP_COOKIE" else ",") + value
            else:
                env[key] = value
        else:
            raise RequestError(431, f"more than {limits.fields_max} header fields")
        if hosts > 1:
            raise RequestError(400, "more than one Host header")

        chunked, length = body_framing(version, env.get("HTTP_TRANSFER_ENCODING"),
                                       content_lengths, limits.limit_request_body)
        connection = env.get("HTTP_CONNECTION")
        tokens = {t.strip(" \t").lower() for t in connection.split(",")} if connection else ()
        if version == "HTTP/1.1":
            self.close_connection = "close" in tokens
        else:
            self.close_connection = "keep-alive" not in tokens
        if not limits.keep_alive:
            self.close_connection = True
        expect = None
        if version == "HTTP/1.1" and env.get("HTTP_EXPECT", "").lower() == "100-continue":
            expect = self.socket
        self.body = env["wsgi.input"] = Body(self.rfile, length, chunked, limits, expect)
        server.proxy.adjust(env, address, self._proxy_info)
        self.environ = env
        return env

    # -- the response

    def _respond(self, env):
        self.status = self._orig_status = self.code = None
        self.headers_sent = self.response_use_chunked = False
        self.response_length = self._body_sent = 0
        self._cl_left = None
        self._no_body = self.command == "HEAD"
        result = None
        try:
            try:
                self.result = result = self.application(env, self.start_response)
                for data in result:
                    if data:
                        self.write(data)
                if not self.headers_sent:
                    self.write(b"")  # empty body; raises if start_response was never called
                if self.response_use_chunked:
                    self._sendall(b"0\r\n\r\n")
            finally:
                self.result = None
                close = getattr(result, "close", None)
                if close is not None:
                    close()
        except RequestError as ex:  # from wsgi.input; logged once the response is done
            self._answer(ex.status)
        except ClientDisconnected:
            self.close_connection = True
        except (Exception, Timeout):  # a gevent.Timeout the application didn't catch
            self.server.logger.exception("error handling %s from %s",
                                         escape(self.requestline), self._peer())
            self._answer(500)
        else:
            if self._cl_left:
                self.server.logger.warning(
                    "%s: application sent %d bytes fewer than its Content-Length; closing",
                    escape(self.requestline), self._cl_left)
                self.close_connection = True

    def _answer(self, status):
        """Send an error response if the status line hasn't gone out yet; close."""
        self.close_connection = True
        if self.headers_sent:
            return
        body = REASONS[status].encode()
        try:
            self.start_response(f"{status} {REASONS[status]}", [
                ("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
            self.write(body)
        except ClientDisconnected:
            pass

    def finalize_headers(self):
        headers = self.response_headers
        if self.provided_date is None:
            headers.append((b"Date", self.server.http_date()))
        code = self.code
        if self.server.draining:
            self.close_connection = True
        if code >= 200 and code not in (204, 304):
            if self.provided_content_length is not None:
                length = self.provided_content_length.strip()
                if not length.isdigit() or not length.isascii():
                    raise self.ApplicationError(f"invalid Content-Length {length!r} from the application")
                if not self._no_body:
                    self._cl_left = int(length)
            elif hasattr(self.result, "__len__"):
                length = sum(len(chunk) for chunk in self.result)
                headers.append((b"Content-Length", b"%d" % length))
            elif self.request_version == "HTTP/1.1":
                headers.append((b"Transfer-Encoding", b"chunked"))
                self.response_use_chunked = not self._no_body
            elif not self._no_body:
                self.close_connection = True  # HTTP/1.0: the close ends the body
        if self.close_connection:
            for i, (name, value) in enumerate(headers):
                if name.lower() == b"connection":
                    headers[i] = (name, b"close")
                    break
            else:
                headers.append((b"Connection", b"close"))

    def _write(self, data):
        if not data or self._no_body:
            return
        left = self._cl_left
        if left is not None:
            if len(data) > left:
                self.server.logger.warning(
                    "%s: application sent more than its Content-Length; truncated and closing",
                    escape(self.requestline))
                self.close_connection = True
                data = data[:left]
                if not data:
                    return
            self._cl_left = left - len(data)
        self._body_sent += len(data)
        if self.response_use_chunked:
            self._sendall(b"%x\r\n%b\r\n" % (len(data), data))
        else:
            self._sendall(data)

    def _sendall(self, data):
        try:
            self.socket.sendall(data)
        except OSError as ex:
            if ex.errno not in GONE_ERRNOS:
                raise
            raise ClientDisconnected("client went away during the response") from ex
        self.response_length += len(data)

    # -- timers, closing, logging

    def _arm(self, timer):
        if timer is not None:
            timer.again(self._greenlet.throw, _Expired)

    @staticmethod
    def _disarm(timer):
        if timer is not None:
            timer.stop()

    def _bounded(self, timer, func):
        """func() under `timer`; False if it expired or the client went away."""
        try:
            self._arm(timer)
            try:
                return func()
            finally:
                self._disarm(timer)
        except _Expired:
            return False

    def close_if_idle(self):
        """Drain: close the connection now if it is between requests.

        A connection that has not sent its first request yet is not idle: the
        client connected to a server that was accepting and is about to send;
        its request is read (bounded by header_timeout) and answered.
        """
        if self.state == IDLE:
            self.abort()

    def abort(self):
        """Shut the connection down; a greenlet blocked on it wakes with EBADF."""
        sock = self.socket
        if sock is not None:
            try:
                sock.shutdown(SHUT_RDWR)
            except OSError as ex:
                if ex.errno not in GONE_ERRNOS:
                    raise

    def _send_raw(self, status):
        body = REASONS[status].encode()
        head = (f"HTTP/1.1 {status} {REASONS[status]}\r\nContent-Type: text/plain\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n")
        try:
            self.socket.sendall(head.encode() + body)
        except OSError as ex:
            if ex.errno not in GONE_ERRNOS:
                raise

    def _close(self):
        sock = self.socket
        if sock is None:
            return
        if self._linger:
            timer = _timer(self.server.loop, LINGER_SECONDS)
            try:
                self._bounded(timer, self._linger_read)
            finally:
                timer.close()
        self.rfile.close()
        sock.close()
        self.socket = None

    def _linger_read(self):
        sock = self.socket
        try:
            sock.shutdown(SHUT_WR)
            received = 0
            while received < LINGER_BYTES:
                data = sock.recv(65536)
                if not data:
                    break
                received += len(data)
        except OSError as ex:
            if ex.errno not in GONE_ERRNOS:
                raise
        return True

    def _peer(self):
        address = self.client_address
        return address[0] if isinstance(address, tuple) and address else "unix"

    def _log_refusal(self, error):
        self.server.logger.info("refused request from %s: %d %s",
                                self._peer(), error.status, error.reason)

    def _log_access(self):
        server = self.server
        if server.access_log.isEnabledFor(logging.INFO):
            server.access_write(server.access_format.line(
                self.environ, self.requestline, self.code,
                self.response_headers if self.headers_sent else (),
                self._body_sent if self.code else None, time.perf_counter() - self._started))


def _timer(loop, seconds):
    """A loop timer for _arm(), or None for 0 seconds. Armed with again(),
    which restarts the full interval: libev's stop() keeps only the time
    *remaining*, so a timer reused with start() would count down across
    requests and expire on a busy keep-alive connection."""
    return loop.timer(seconds, seconds) if seconds else None

