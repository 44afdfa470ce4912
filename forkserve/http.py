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
  body_framing, chunk_size), so unit tests drive them without sockets.
"""

import errno
import logging
import re
import time
from dataclasses import dataclass
from socket import SHUT_RDWR, SHUT_WR
from urllib.parse import unquote

from gevent import getcurrent
from gevent import Timeout
from gevent.pywsgi import WSGIHandler

__all__ = ["Limits", "Handler", "RequestError", "ClientDisconnected",
           "request_line", "header_field", "body_framing", "chunk_size"]

#: What a limit of 0 means for the head limits: gunicorn calls 0 "unlimited";
#: we keep a ceiling so one connection's head can't hold unbounded memory.
LINE_CEILING = 65536
FIELDS_CEILING = 32768

#: Longest chunk-size line (size plus extensions) accepted in a chunked body.
CHUNK_LINE_MAX = 4096

#: After a refusal or an unread body, keep reading (and discarding) for this
#: long / this much before closing, so the client gets our response, not a
#: TCP reset triggered by its unread data (the "lingering close" of nginx).
LINGER_SECONDS = 1.0
LINGER_BYTES = 1 << 20

#: An unread request body smaller than this is skipped to keep the connection;
#: a larger one closes it, which is cheaper than reading it.
DISCARD_BYTES = 64 * 1024

#: Stray CRLFs tolerated before a request line (RFC 9112 section 2.2).
BLANK_LINES = 2

# errnos that only mean "the client went away"; anything else is a real error.
GONE_ERRNOS = frozenset({
    errno.EPIPE, errno.ECONNRESET, errno.ECONNABORTED, errno.ETIMEDOUT,
    errno.ENOTCONN, errno.ESHUTDOWN, errno.EBADF,
})

REASONS = {
    400: "Bad Request", 408: "Request Timeout", 413: "Content Too Large",
    414: "URI Too Long", 431: "Request Header Fields Too Large",
    500: "Internal Server Error", 501: "Not Implemented",
    505: "HTTP Version Not Supported",
}


@dataclass(frozen=True)
class Limits:
    """Per-request limits and connection timeouts (gunicorn's names and defaults).

    A head limit of 0 means the ceiling (LINE_CEILING, FIELDS_CEILING);
    limit_request_body=0 means no limit; a timeout of 0 disables it
    (keep_alive=0 also answers every request with Connection: close).
    """

    limit_request_line: int = 4094
    limit_request_fields: int = 100
    limit_request_field_size: int = 8190
    limit_request_body: int = 0
    header_timeout: float = 10.0
    keep_alive: float = 5.0

    def __post_init__(self):
        for name, value in vars(self).items():
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name} must be a number >= 0, got {value!r}")

    @property
    def line_max(self):
        return min(self.limit_request_line or LINE_CEILING, LINE_CEILING)

    @property
    def field_size_max(self):
        return min(self.limit_request_field_size or LINE_CEILING, LINE_CEILING)

    @property
    def fields_max(self):
        return min(self.limit_request_fields or FIELDS_CEILING, FIELDS_CEILING)


class RequestError(Exception):
    """The client sent something we refuse; answer `status` and close."""

    def __init__(self, status, reason):
        super().__init__(status, reason)
        self.status = status
        self.reason = reason


class ClientDisconnected(OSError):
    """The client closed or reset the connection mid-request or mid-response."""


class _Expired(BaseException):
    """Thrown into a connection's greenlet by its header or idle timer."""


# --- The grammar (RFC 9110/9112), as pure functions --------------------------

TCHAR = r"!#$%&'*+\-.^_`|~0-9A-Za-z"
_TOKEN = re.compile(f"[{TCHAR}]+")
# Request target: visible ASCII or obs-text, no whitespace or controls.
_REQUEST_LINE = re.compile(
    f"([{TCHAR}]+) ([\x21-\x7e\x80-\xff]+) HTTP/([0-9])\\.([0-9])\r\n")
_TARGET = re.compile("[\x21-\x7e\x80-\xff]+")
# Field value: VCHAR, obs-text, SP and HTAB; OWS is stripped afterwards.
_FIELD = re.compile(f"([{TCHAR}]+):([\t\x20-\x7e\x80-\xff]*)\r\n")
_ABSOLUTE = re.compile(r"https?://[^/?]*", re.IGNORECASE)
_QUOTED = rb'"(?:[\t \x21\x23-\x5b\x5d-\x7e\x80-\xff]|\\[\t \x21-\x7e\x80-\xff])*"'
_BTOKEN = f"[{TCHAR}]+".encode()
_CHUNK_LINE = re.compile(
    rb"([0-9A-Fa-f]{1,16})"
    rb"(?:[ \t]*;[ \t]*" + _BTOKEN + rb"(?:[ \t]*=[ \t]*(?:" + _BTOKEN + rb"|" + _QUOTED + rb"))?)*"
    rb"\r\n")
_DIGITS = re.compile("[0-9]{1,18}")


def request_line(line, line_max):
    """Parse a request line read with readline(line_max + 2).

    Returns (method, target, version) or None if the client closed the
    connection mid-line; raises RequestError for anything else invalid.
    """
    text = line.decode("latin-1")
    match = _REQUEST_LINE.fullmatch(text)
    if match is not None and len(line) <= line_max + 2:
        method, target, major, minor = match.groups()
        if major != "1":
            raise RequestError(505, f"unsupported version HTTP/{major}.{minor}")
        # RFC 9110 6.2: a higher minor version is processed as the highest we know.
        return method, target, "HTTP/1.0" if minor == "0" else "HTTP/1.1"
    if len(line) > line_max + 2 or (len(line) == line_max + 2 and not text.endswith("\n")):
        raise RequestError(414, f"request line longer than {line_max} bytes")
    if not text.endswith("\n"):
        return None
    if not text.endswith("\r\n"):
        raise RequestError(400, "request line not terminated by CRLF")
    words = text[:-2].split(" ")
    if len(words) != 3:
        raise RequestError(400, "request line is not 'METHOD target HTTP/1.x'")
    method, target, version = words
    if not _TOKEN.fullmatch(method):
        raise RequestError(400, f"invalid method {escape(method[:40])}")
    if not _TARGET.fullmatch(target):
        raise RequestError(400, "invalid character in request target")
    raise RequestError(400, f"invalid HTTP version {escape(version[:20])}")


def header_field(line, size_max):
    """Parse one header (or trailer) line read with readline(size_max + 2).

    Returns (name, value), or None if the client closed mid-line.
    """
    text = line.decode("latin-1")
    match = _FIELD.fullmatch(text)
    if match is not None:
        return match.group(1), match.group(2).strip(" \t")
    if not text.endswith("\n"):
        if len(line) >= size_max + 2:
            raise RequestError(431, f"header field longer than {size_max} bytes")
        return None
    if not text.endswith("\r\n"):
        raise RequestError(400, "header line not terminated by CRLF")
    if text[0] in " \t":
        raise RequestError(400, "obsolete line folding in header")
    name, colon, value = text[:-2].partition(":")
    if not colon:
        raise RequestError(400, "header line without a colon")
    if name != name.rstrip(" \t"):
        raise RequestError(400, "whitespace between header name and colon")
    if not _TOKEN.fullmatch(name):
        raise RequestError(400, f"invalid header name {escape(name[:40])}")
    raise RequestError(400, f"control character in header {escape(name)}")


def body_framing(version, transfer_encoding, content_lengths, body_max):
    """Decide how the request body is framed: returns (chunked, length).

    `transfer_encoding` is the comma-joined value of every Transfer-Encoding
    line (or None), `content_lengths` the list of Content-Length values.
    Unsupported codings before a final "chunked" get 501; everything else
    ambiguous gets 400, as RFC 9112 section 6 asks of a server.
    """
    if transfer_encoding is not None:
        if content_lengths:
            raise RequestError(400, "both Content-Length and Transfer-Encoding")
        if version == "HTTP/1.0":
            raise RequestError(400, "Transfer-Encoding in an HTTP/1.0 request")
        codings = [c.strip(" \t").lower() for c in transfer_encoding.split(",")]
        if not all(_TOKEN.fullmatch(c) for c in codings) or codings[-1] != "chunked":
            raise RequestError(400, f"Transfer-Encoding {escape(transfer_encoding[:60])}"
                                    " does not end in chunked")
        if codings.count("chunked") > 1:
            raise RequestError(400, "chunked applied more than once")
        if len(codings) > 1:
            raise RequestError(501, f"unsupported Transfer-Encoding {escape(transfer_encoding[:60])}")
        return True, None
    if not content_lengths:
        return False, 0
    if len(content_lengths) > 1:
        raise RequestError(400, "more than one Content-Length")
    if not _DIGITS.fullmatch(content_lengths[0]):
        raise RequestError(400, f"invalid Content-Length {escape(content_lengths[0][:30])}")
    length = int(content_lengths[0])
    if body_max and length > body_max:
        raise RequestError(413, f"Content-Length {length} over the {body_max}-byte limit")
    return False, length


def chunk_size(line):
    """Parse a chunk-size line (extensions are checked and ignored).

    Returns the size, or None if the client closed mid-line.
    """
    match = _CHUNK_LINE.fullmatch(line)
    if match is not None:
        return int(match.group(1), 16)
    if not line.endswith(b"\n") and len(line) < CHUNK_LINE_MAX + 2:
        return None
    raise RequestError(400, "invalid chunk-size line")


_LOG_ESCAPES = {c: f"\\x{c:02x}" for c in (*range(0x20), 0x22, 0x5C, 0x7F)}


def escape(text):
    """Make client-supplied text safe for a log line: only printable ASCII
    remains, and quotes, backslashes and everything else become \\xNN escapes."""
    if text.isascii() and text.isprintable() and '"' not in text and "\\" not in text:
        return text
    return text.translate(_LOG_ESCAPES).encode("ascii", "backslashreplace").decode("ascii")


# --- wsgi.input ---------------------------------------------------------------

class Body:
    """wsgi.input: reads exactly the request body, then returns b"".

    Raises RequestError (400, or 413 past limit_request_body for chunked
    bodies) or ClientDisconnected; the first error is kept in `error` and
    re-raised by later reads, so the handler closes the connection even if
    the application swallowed it.
    """

    __slots__ = ("_rfile", "_left", "_chunked", "_done", "_total", "_limits",
                 "_continue", "error")

    def __init__(self, rfile, length, chunked, limits, continue_socket=None):
        self._rfile = rfile
        self._left = length or 0  # bytes left (in the current chunk if chunked)
        self._chunked = chunked
        self._done = not chunked and not length
        self._total = 0
        self._limits = limits
        self._continue = continue_socket if not self._done else None
        self.error = None

    def read(self, size=-1):
        return self._read(size, False)

    def readline(self, size=-1):
        return self._read(size, True)

    def readlines(self, hint=-1):
        lines, total = [], 0
        for line in self:
            lines.append(line)
            total += len(line)
            if 0 < hint <= total:
                break
        return lines

    def __iter__(self):
        return self

    def __next__(self):
        line = self._read(-1, True)
        if not line:
            raise StopIteration
        return line

    def _read(self, size, line):
        if self._done:
            return b""
        if self.error is not None:
            raise self.error
        try:
            if self._continue is not None:
                sock, self._continue = self._continue, None
                sock.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
            if size is None or size < 0:
                size = None
            return self._read_chunked(size, line) if self._chunked else self._read_fixed(size, line)
        except RequestError as ex:
            self.error = ex
            raise
        except OSError as ex:
            if ex.errno not in GONE_ERRNOS and not isinstance(ex, ClientDisconnected):
                raise
            self.error = ClientDisconnected("client went away while sending the body")
            raise self.error from ex

    def _read_fixed(self, size, line):
        want = self._left if size is None else min(size, self._left)
        data = (self._rfile.readline if line else self._rfile.read)(want)
        self._left -= len(data)
        self._done = not self._left
        if len(data) < want and not (line and data.endswith(b"\n")):
            raise ClientDisconnected("client closed the connection mid-body")
        return data

    def _read_chunked(self, size, line):
        rfile, parts = self._rfile, []
        while not self._done and (size is None or size > 0):
            if not self._left:
                self._next_chunk()
                continue
            want = self._left if size is None else min(size, self._left)
            data = rfile.readline(want) if line else rfile.read(want)
            if not data or (len(data) < want and not data.endswith(b"\n")):
                raise ClientDisconnected("client closed the connection mid-chunk")
            parts.append(data)
            self._left -= len(data)
            if size is not None:
                size -= len(data)
            if not self._left and rfile.read(2) != b"\r\n":
                raise RequestError(400, "chunk data not followed by CRLF")
            if line and data.endswith(b"\n"):
                break
        return b"".join(parts)

    def _next_chunk(self):
        size = chunk_size(self._rfile.readline(CHUNK_LINE_MAX + 2))
        if size is None:
            raise ClientDisconnected("client closed the connection mid-chunk")
        if size == 0:
            self._read_trailers()
            self._done = True
            return
        self._total += size
        body_max = self._limits.limit_request_body
        if body_max and self._total > body_max:
            raise RequestError(413, f"chunked body over the {body_max}-byte limit")
        self._left = size

    def _read_trailers(self):
        limits = self._limits
        size_max = limits.field_size_max
        for _ in range(limits.fields_max + 1):
            line = self._rfile.readline(size_max + 2)
            if line == b"\r\n":
                return
            if header_field(line, size_max) is None:
                raise ClientDisconnected("client closed the connection in the trailers")
        raise RequestError(431, "too many trailer fields")

    @property
    def done(self):
        """True once the body was read to its end."""
        return self._done

    def finish(self):
        """Skip what the application left unread; True if the connection can
        carry another request (body consumed exactly, no error, no pending
        100-continue the client may still be waiting for)."""
        if self.done:
            return True
        if self.error is not None or self._continue is not None:
            return False
        if not self._chunked and self._left > DISCARD_BYTES:
            return False
        skipped = 0
        try:
            while not self._done and skipped <= DISCARD_BYTES:
                skipped += len(self._read(16384, False))
        except (RequestError, ClientDisconnected):
            return False
        return self._done


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
    _log_fields = None
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
        if server.access_log is not None:
            self._log_fields = (env.get("HTTP_REFERER", "-"), env.get("HTTP_USER_AGENT", "-"))
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
        log = self.server.access_log
        if not log.isEnabledFor(logging.INFO):
            return
        referer, agent = self._log_fields
        now = time.localtime()
        micros = int((time.perf_counter() - self._started) * 1e6)
        log.info('%s - - [%02d/%s/%d:%02d:%02d:%02d %s] "%s" %s %s "%s" "%s" %d',
                 self._peer(), now.tm_mday, _MONTHS[now.tm_mon], now.tm_year,
                 now.tm_hour, now.tm_min, now.tm_sec, time.strftime("%z", now),
                 escape(self.requestline), self.code or "-", self._body_sent or "-",
                 escape(referer), escape(agent), micros)


def _timer(loop, seconds):
    """A loop timer for _arm(), or None for 0 seconds. Armed with again(),
    which restarts the full interval: libev's stop() keeps only the time
    *remaining*, so a timer reused with start() would count down across
    requests and expire on a busy keep-alive connection."""
    return loop.timer(seconds, seconds) if seconds else None


_MONTHS = (None, "Jan", "Feb", "Mar", "Apr", "May", "Jun",
           "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
