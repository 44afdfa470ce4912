"""One HTTP/1.x connection of a forkserve worker: read a request, run the WSGI
application (PEP 3333), send the response, repeat while keep-alive allows.

gevent provides the socket, the greenlet this runs in and the loop's timers;
everything HTTP is here, in forkserve.http.responder (the response side) or
in forkserve.http.h1 (the grammar, which does no I/O). Nothing here
subclasses or reaches into a gevent class.

Invariants, and why:

- The application sees a request only after its request line and every header
  field matched the RFC 9112 grammar and its body framing is unambiguous
  (Content-Length xor chunked, exactly once). Anything else is refused with a
  4xx/5xx and the connection is closed: a proxy in front may have framed the
  same bytes differently, and whatever we read next could be a smuggled request.
- A refused connection is never read from again as HTTP. Its close lingers
  briefly (LINGER_SECONDS) so the client reads the error instead of a reset.
- Every response after which the connection closes says `Connection: close`:
  the decision is made once, when the response head is built
  (`_keep_alive`), and never changed afterwards except by an error that cuts
  the response short. A connection is reused only if the request body was
  consumed to its exact end and the response was framed exactly.
- Draining (reload, stop, --max-requests reached): the next response on every
  connection says `Connection: close`, unless the client already sent another
  request on it (pipelined), which is answered too. Idle connections are not
  closed early: the client may be sending its next request right now; they
  close after `keep_alive` idle seconds like any other, and the server's
  graceful timeout force-closes what remains.
- Timers bound every wait on the client, and none runs while the application
  does: idle (keep_alive) between requests, header_timeout from a request's
  first byte (or the connection's start) to its last header line,
  body_timeout for the whole request body from the application's first read,
  send_timeout for each send of the response.
- One response is one send where possible: head and body joined when the
  application returns a list (the usual case), head and first chunk joined
  when it returns an iterator.
"""

import time
from functools import partial
from urllib.parse import unquote

from gevent import sleep

from forkserve.http.body import Body
from forkserve.http.h1 import (  # the grammar; re-exported names are in __all__
    _Expired, BLANK_LINES, body_framing,
    chunk_size, ClientDisconnected, escape, GONE_ERRNOS, header_field,
    Limits, Memo, request_line, request_target, RequestError, valid_host,
)
from forkserve.http.responder import Responder
from forkserve.http.response import ApplicationError, FileWrapper

__all__ = ["Limits", "Handler", "ErrorStream", "FileWrapper", "RequestError", "ClientDisconnected",
           "ApplicationError", "request_line", "header_field", "body_framing", "chunk_size",
           "escape"]

IDLE, HEAD, BUSY = "idle", "head", "busy"

#: A connection yields to the event loop after this many requests in a row.
#: gevent only switches greenlets when a socket would block, and a client
#: that pipelines keeps data waiting: without the yield its greenlet ran for
#: seconds, starving the other connections and the worker's heartbeat, and
#: the master killed the "blocked" worker (connections reset mid-blast).
YIELD_EVERY = 16

#: header name as sent -> its environ key (CONTENT_TYPE, HTTP_USER_AGENT)
_KEYS = Memo()

#: Request lines and header lines already parsed, by their bytes, with what
#: the head loop takes from them: clients repeat the same lines (Host,
#: User-Agent, Accept, often the request line itself). Parsing a complete
#: line is a pure function of its bytes, and a line only reaches the parser
#: within the connection's line limits, so a memo changes no result. Lines
#: longer than _MEMO_LINE are not remembered; unique lines, such as request
#: targets that differ per request, cycle through the memo.
_REQUEST_LINES = Memo()   # line -> (method, target, version, request line as str)
_FIELD_LINES = Memo()     # line -> (environ key, or None for a dropped name; value)
_MEMO_LINE = 256


def _environ_key(name):
    key = name.upper().replace("-", "_")
    if key not in ("CONTENT_LENGTH", "CONTENT_TYPE"):
        key = "HTTP_" + key
    return _KEYS.remember(name, key)


_EMPTY_BODY = Body(None, 0, False, Limits())  # shared: a length-0 Body never reads
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


class _BodyInput:
    """What `Body` reads from: the connection's buffered file, behind the
    100 Continue (sent before the first read) and the body timeout."""

    __slots__ = ("_handler", "continue_pending", "deadline")

    def __init__(self, handler, expect_continue):
        self._handler = handler
        self.continue_pending = expect_continue
        self.deadline = None

    def read(self, size):
        return self._handler.read_body(self, False, size)

    def readline(self, size):
        return self._handler.read_body(self, True, size)


class ErrorStream:
    """wsgi.errors: what the application writes becomes ERROR log records.

    With a `connection`, a traceback written while its request body has
    failed is dropped: it is the application reporting the refusal the
    server logs once (and answers) itself, 30 lines per slow client.
    """

    TRACEBACK = "Traceback (most recent call last)"

    def __init__(self, logger, connection=None):
        self._logger = logger
        self._connection = connection

    def write(self, text):
        text = text.rstrip("\n")
        if not text:
            return
        connection = self._connection
        if connection is not None and connection.body.error is not None \
                and self.TRACEBACK in text:
            return
        self._logger.error("%s", text)

    def writelines(self, lines):
        for line in lines:
            self.write(line)

    def flush(self):
        pass


class Handler(Responder):
    """Serves one connection: a loop of read head -> run app -> respond.

    `state` is IDLE while waiting for a request, HEAD while reading one,
    BUSY while the application runs and the response is sent.
    """

    def __init__(self, sock, address, server):
        super().__init__(sock, address, server)
        self.application = server.application
        self.state = IDLE
        self.close_connection = False
        self.environ = None
        self.body = _EMPTY_BODY
        self.requestline = ""
        self._input = None
        self._served = 0
        self._started = 0.0
        self._proxy_info = None   # what a PROXY protocol header said, if one came
        # The environ's part that is the same for every request on this connection.
        self._base_env = env = server.base_env.copy()
        env["wsgi.errors"] = ErrorStream(server.logger, self)
        if isinstance(address, tuple):
            env["REMOTE_ADDR"] = address[0]
            env["REMOTE_PORT"] = str(address[1])

    # -- connection loop

    def handle(self):
        try:
            first = True
            while self._next_request(first):
                first = False
        except ClientDisconnected:
            pass
        finally:
            for timer in (self._head_timer, self._idle_timer, self._send_timer):
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
        sink = server.access_sink
        if sink is not None:  # the access log: a line for a request the application saw
            sink(env, self.requestline, self.code,
                 self._response_headers if self.headers_sent else (),
                 self._body_sent if self.code else None, self._started)
        body = self.body
        if body.error is not None:
            if isinstance(body.error, RequestError):
                self._log_refusal(body.error)
            self._linger = True
            return False
        if self.close_connection:
            self._linger = not body.done
            return False
        if not body.done and not body.finish():  # its rest is buffered (see _keep_alive)
            return False
        self._served += 1
        if not self._served % YIELD_EVERY:
            sleep(0)
        return True

    def _read_request(self, first):
        """Wait for a request and read its head; returns the environ, or None
        if the connection should close (EOF, timeout, refusal)."""
        self.state = IDLE if not first else HEAD
        rfile = self.rfile
        started = b""
        # Connection._arm/_disarm written out: five calls fewer per request
        head_timer, idle_timer = self._head_timer, self._idle_timer
        try:
            try:
                if first:
                    if head_timer is not None:
                        head_timer.again(self._throw, _Expired)
                    started = rfile.peek(1)
                else:
                    if idle_timer is not None:
                        idle_timer.again(self._throw, _Expired)
                    started = rfile.peek(1, wait_first=True)
                    if idle_timer is not None:
                        idle_timer.stop()
                    if head_timer is not None:
                        head_timer.again(self._throw, _Expired)
                if not started:
                    return None
                self.state = HEAD
                self._started = time.perf_counter()
                if first:  # a PROXY protocol header comes before the first request
                    self._proxy_info = self.server.proxy.read_header(rfile, self.client_address)
                return self._read_head()
            finally:
                if head_timer is not None:
                    head_timer.stop()
                if idle_timer is not None:
                    idle_timer.stop()
        except _Expired:
            if started:  # quiet close unless part of a request arrived
                self._log_refusal(RequestError(408, "request head not received in time"))
                self._send_error(408)
            return None
        except RequestError as ex:
            self._log_refusal(ex)
            self._send_error(ex.status)
            self._linger = True
            return None
        except OSError as ex:
            if ex.errno in GONE_ERRNOS:
                return None
            raise

    def _read_head(self):
        server = self.server
        limits = server.limits
        line_max = limits.line_max
        size_max = limits.field_size_max
        rfile = self.rfile
        lines = rfile.head_lines(min(line_max + 2, size_max))
        if lines is not None:  # the usual case: the whole head is buffered
            next_line = field_line = iter(lines).__next__
        else:
            next_line = partial(rfile.readline, line_max + 2)
            field_line = partial(rfile.readline, size_max)
        line = next_line()
        for _ in range(BLANK_LINES):
            if line != b"\r\n":
                break
            line = next_line()
        parsed = _REQUEST_LINES.get(line)
        if parsed is None:
            parsed = request_line(line, line_max)
            if parsed is None:
                return None
            parsed += (line[:-2].decode("latin-1"),)
            if len(line) <= _MEMO_LINE:
                _REQUEST_LINES.remember(line, parsed)
        method, target, version, self.requestline = parsed

        env = self._base_env.copy()
        content_lengths = []
        hosts = 0
        for _ in range(limits.fields_max + 1):
            line = field_line()
            if line == b"\r\n":
                break
            parsed = _FIELD_LINES.get(line)
            if parsed is None:
                field = header_field(line, size_max)
                if field is None:
                    return None
                name, value = field
                # a name with "_" is dropped, like gunicorn: X_Forwarded_For
                # must not pose as X-Forwarded-For
                parsed = (None if "_" in name else _KEYS.get(name) or _environ_key(name)), value
                if len(line) <= _MEMO_LINE:
                    _FIELD_LINES.remember(line, parsed)
            key, value = parsed
            if key is None:
                continue
            if key == "CONTENT_LENGTH":
                content_lengths.append(value)
                env["CONTENT_LENGTH"] = value
                continue
            if key == "CONTENT_TYPE":
                if "CONTENT_TYPE" in env:
                    raise RequestError(400, "more than one Content-Type header")
                env["CONTENT_TYPE"] = value
                continue
            if key == "HTTP_HOST":
                hosts += 1
            if key in env:
                env[key] += ("; " if key == "HTTP_COOKIE" else ",") + value
            else:
                env[key] = value
        else:
            raise RequestError(431, f"more than {limits.fields_max} header fields")
        if hosts > 1:
            raise RequestError(400, "more than one Host header")
        if hosts and not valid_host(env["HTTP_HOST"]):
            raise RequestError(400, f"invalid Host {escape(env['HTTP_HOST'][:60])}")
        if not hosts and version == "HTTP/1.1":
            raise RequestError(400, "HTTP/1.1 request without a Host header")
        self.make_environ(env, method, target, version)

        chunked, length = body_framing(version, env.get("HTTP_TRANSFER_ENCODING"),
                                       content_lengths, limits.limit_request_body)
        connection = env.get("HTTP_CONNECTION")
        if connection is None:
            self.close_connection = version == "HTTP/1.0"
        else:
            tokens = {t.strip(" \t").lower() for t in connection.split(",")}
            self.close_connection = ("close" in tokens if version == "HTTP/1.1"
                                     else "keep-alive" not in tokens)
        if not limits.keep_alive:
            self.close_connection = True
        if chunked or length:
            expect = (version == "HTTP/1.1"
                      and env.get("HTTP_EXPECT", "").lower() == "100-continue")
            self._input = _BodyInput(self, expect)
            self.body = Body(self._input, length, chunked, limits)
        else:
            self._input = None
            self.body = _EMPTY_BODY
        env["wsgi.input"] = self.body
        self._version = version
        self._no_body = method == "HEAD"
        server.proxy.adjust(env, self.client_address, self._proxy_info)
        self.environ = env
        return env

    def make_environ(self, env, method, target, version):
        """Fill the CGI part of the WSGI environ (headers are already in `env`)."""
        path, query, authority = request_target(method, target)
        if authority is not None:  # RFC 9112 3.2.2: the target's authority wins
            env["HTTP_HOST"] = authority
        env["REQUEST_METHOD"] = method
        env["SERVER_PROTOCOL"] = version
        env["RAW_URI"] = env["REQUEST_URI"] = target
        script_name = env["SCRIPT_NAME"]
        if script_name:  # mounted under a prefix: as Gunicorn, raw bytes compared, 500 outside
            if not path.startswith(script_name):
                raise RequestError(500, f"request path {escape(path[:60])} does not start with "
                                        f"SCRIPT_NAME {escape(script_name)} (the proxy in front "
                                        "must forward only paths under it)")
            path = path[len(script_name):]
        env["PATH_INFO"] = unquote(path, "latin-1") if "%" in path else path
        env["QUERY_STRING"] = query

    # -- the request body

    def read_body(self, source, line, size):
        """A read for `Body`: sends 100 Continue first if the client waits for
        it, and bounds the whole body by body_timeout."""
        if source.continue_pending:
            source.continue_pending = False
            self._send(_CONTINUE)
        read = self.rfile.readline if line else self.rfile.read
        timeout = self.server.limits.body_timeout
        if not timeout:
            return read(size)
        now = time.monotonic()
        if source.deadline is None:
            source.deadline = now + timeout
        left = source.deadline - now
        if left <= 0:
            raise RequestError(408, f"request body not received within {timeout:g} s "
                                    "(--body-timeout)")
        timer = self.server.loop.timer(left)
        timer.start(self._throw, _Expired)
        try:
            return read(size)
        except _Expired:
            raise RequestError(408, f"request body not received within {timeout:g} s "
                                    "(--body-timeout)") from None
        finally:
            timer.close()

    def _log_refusal(self, error):
        self.server.logger.info("refused request from %s: %d %s",
                                self._peer(), error.status, error.reason)
