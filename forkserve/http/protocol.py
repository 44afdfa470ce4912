"""One HTTP/1.1 server connection without I/O, in the manner of h11: bytes in,
events out (a request head, body data, the end of the body); response parts
in, bytes out. forkserve.http.handler drives it over a gevent socket, the
stats endpoint over its select() loop, and the unit tests over plain bytes.

The grammar is forkserve.http.h1's (pure functions of a line, or of a whole
head in its usual form); this module owns what spans lines and requests:
the head's rules, the body's framing (Content-Length, chunked, trailers),
the limits, 100-continue and whether the connection is reused. Where the
C extension is built, the state lives in its ConnectionBase
(forkserve/http/_h1_connection.c), which takes a usual request's steps
(receive, parse, answer whole, next cycle) itself and hands every other
case to the methods here; PythonConnectionBase is the same in Python.

States. The client's side (`their_state`):
  IDLE   no byte of the next request yet (a keep-alive wait)
  HEAD   part of a request head received
  BODY   the head is parsed, its body is being received
  DONE   the whole request was received
  ERROR  the client broke the protocol: next_event raised RequestError; the
         connection is answered with that status (`refusal`) and closed
  CLOSED the client closed the connection between requests
Our side (`our_state`): IDLE (no response started), SEND_BODY (the head went
out), DONE (the response ended).

Invariants, and why:
- A request is produced only when its request line and every header field
  matched the grammar and its framing is unambiguous (h1's invariants); the
  first violation raises RequestError and puts the connection in ERROR,
  from which nothing is parsed again: what follows could be a smuggled
  request.
- Every close is decided here. Keep-alive is decided once, as the response
  head is built (`response_head`, `whole_response`), from the request
  (version, Connection), the application (Connection: close), the framing
  of both bodies, the server (keep_alive = 0, `drain()`: a reload or stop)
  and what was received: an unread request body
  keeps the connection only if it arrived whole and is small
  (DISCARD_BYTES), so skipping it cannot wait. The head says `Connection:
  close` exactly when the connection will close; only a response cut short
  (the application's fault) or a body that failed (`body_failed`) closes it
  later, and `start_next_cycle` says so.
- Limits are checked as bytes arrive, so a client cannot make the buffer
  hold more than one line over its limit.
"""

from forkserve.cext import c_extension
from forkserve.http.h1 import (BLANK_LINES, CHUNK_LINE_MAX, DISCARD_BYTES, REASONS, RequestError,
                               body_framing, chunk_size, escape, header_field, request_head,
                               request_line, request_target, trailer_allowed, valid_host)
from forkserve.http.response import build_head

__all__ = ["Connection", "ConnectionBase", "PythonConnectionBase", "Request", "PythonRequest",
           "REQUEST_FIELDS", "plain_response", "Data", "END", "NEED_DATA", "PEER_CLOSED", "IDLE",
           "HEAD", "BODY", "DONE", "ERROR", "CLOSED", "SEND_BODY"]

#: The usual request head in and response head out, and the connection's
#: per-request steps, in C (forkserve/http/_h1.c, _h1_connection.c), or None:
#: then the Python code below does all of it, as it does for every head the
#: C code declines.
_H1 = c_extension("forkserve.http._h1")

# the states, the C code's own objects where it is built (it compares them by identity)
IDLE, HEAD, BODY, DONE, ERROR, CLOSED, SEND_BODY = _H1.STATES if _H1 is not None else (
    "IDLE", "HEAD", "BODY", "DONE", "ERROR", "CLOSED", "SEND_BODY")

_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"

#: The request header names clients send most, as they spell them, each with
#: the environ key _head_done would make of it (HTTP_ and the name upper-cased,
#: "-" as "_"), so that the usual field is keyed with one lookup. A fixed
#: table of names, not a cache: nothing is added to it while serving, and it
#: holds no header value.
_FIELD_KEYS = {name: "HTTP_" + spelling.upper().replace("-", "_") for spelling in (
    "Host", "User-Agent", "Accept", "Accept-Encoding", "Accept-Language", "Connection",
    "Content-Type", "Content-Length", "Cookie", "Authorization", "Referer", "Origin",
    "Cache-Control", "Pragma", "If-None-Match", "If-Modified-Since", "Range", "Expect",
    "Transfer-Encoding", "Upgrade-Insecure-Requests", "X-Forwarded-For", "X-Forwarded-Proto",
    "X-Forwarded-Host", "X-Real-IP", "X-Request-ID", "Sec-Fetch-Dest", "Sec-Fetch-Mode",
    "Sec-Fetch-Site", "Sec-Fetch-User", "DNT", "Priority") for name in (spelling, spelling.lower())}


#: A Connection header of one token as clients spell it -> whether it keeps
#: the connection (HTTP/1.0, HTTP/1.1): the general rule below, precomputed
#: for the values that nginx's proxy_pass (close), curl, wrk and browsers
#: send, so the usual head skips splitting the list.
_ONE_TOKEN = {value: ("keep-alive" == value.lower(), "close" != value.lower())
              for value in ("close", "Close", "keep-alive", "Keep-Alive", "keep-Alive")}


def plain_response(status, body, content_type="text/plain", head_request=False):
    """A whole response of the server's own (a refusal, the stats endpoint's
    answers) that closes the connection: `status` and a `body` of bytes."""
    head = build_head(status, [("Content-Type", content_type), ("Content-Length", str(len(body)))],
                      len(body), False, False, head_request, False, None)[1]
    return head if head_request else head + body


class _Sentinel:
    __slots__ = ("name",)

    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return self.name


#: next_event(): nothing complete is buffered; receive_data() more
NEED_DATA = _Sentinel("NEED_DATA")
#: next_event(): the client closed the connection (between requests: a clean
#: close; in a head or a body: the request is abandoned)
PEER_CLOSED = _Sentinel("PEER_CLOSED")
#: next_event(): the request body ended
END = _Sentinel("END")


#: A Request's fields.
REQUEST_FIELDS = ("method", "target", "version", "line", "headers", "chunked", "length",
                  "expect_continue", "path", "query", "authority", "decoded", "environ")


class PythonRequest:
    """A request head. `headers` are keyed as the WSGI environ keys them
    (CONTENT_TYPE, HTTP_USER_AGENT; repeated fields joined with ",", Cookie
    with "; "; names with "_" dropped, as Gunicorn drops them), because the
    one consumer of a head is a WSGI environ. forkserve/http/_h1.c's
    Request is the same record in C, and is `Request` where it is built."""

    __slots__ = REQUEST_FIELDS

    def __init__(self, method, target, version, line, headers, path, query, authority=None,
                 decoded=False, environ=None):
        self.method = method
        self.target = target
        # the target split as RFC 9112 3.2 says (h1.request_target): `authority`
        # is an absolute-form target's host, which replaces Host
        self.path = path
        self.query = query
        self.authority = authority
        # True if `path` is already percent-decoded (a uwsgi PATH_INFO var)
        self.decoded = decoded
        self.version = version
        self.line = line          # the request line as received, without CRLF (the access log's)
        self.headers = headers
        # the body's framing, as Connection decides it
        self.chunked = False
        self.length = 0           # the Content-Length, 0 without a body, None if chunked
        self.expect_continue = False
        #: the request's whole WSGI environ, if the parser made it (then
        #: `headers` is that environ), else None: forkserve.http.environ
        #: makes it from the head
        self.environ = environ

    def __repr__(self):
        return f"Request({self.line!r}, {self.headers!r})"


#: The request record: the C one, which parse_head makes, where it is built.
Request = PythonRequest if _H1 is None else _H1.Request


class Data:
    """Some bytes of the request body (never empty)."""

    __slots__ = ("data",)

    def __init__(self, data):
        self.data = data

    def __repr__(self):
        return f"Data({self.data!r})"


class PythonConnectionBase:
    """The steps every request on a kept connection takes, where
    forkserve/http/_h1_connection.c's ConnectionBase, which takes them in C
    (and, for the usual request, the parse and the head too), is not built.
    The state is Connection's attributes; next_event and whole_response are
    Connection's _next_event and _whole_response, which the C code calls for
    whatever it does not do itself."""

    def receive_data(self, data):
        """Add bytes the client sent; b"" means it closed its side."""
        if not data:
            self._eof = True
            return
        pos = self._pos
        self._buf = self._buf[pos:] + data if pos < len(self._buf) else data
        self._pos = 0

    @property
    def buffered(self):
        """Bytes received and not consumed yet."""
        return len(self._buf) - self._pos

    def next_event(self, max_bytes=None):
        """The next event from what was received; Data holds at most `max_bytes`."""
        return self._next_event(max_bytes)

    def whole_response(self, status, headers, body, date):
        """The whole response, ended, for a body given at once (see _whole_response)."""
        return self._whole_response(status, headers, body, date)

    def start_next_cycle(self):
        """After a response with keep_alive: skip what is left of the request
        body (all buffered, see _reusable) and wait for the next request.
        Returns False if the connection must close instead."""
        if not self.keep_alive or self.our_state is not DONE:
            return False
        if self.their_state is BODY:
            self._pos += self._left  # _reusable made sure it is all buffered
            self._left = 0
            self.their_state = DONE
        if self.their_state is not DONE:
            return False
        self.their_state = self.our_state = IDLE
        self.request = None
        self.response_problem = None
        self._declared, self._chunked, self.sent, self.code = None, False, 0, None
        return True


#: The connection's state and per-request steps: in C where it is built.
ConnectionBase = PythonConnectionBase if _H1 is None else _H1.ConnectionBase


class Connection(ConnectionBase):
    """The server side of one HTTP/1.1 connection; see the module's states.

    receive_data(bytes) adds what the client sent (b"" once it closed);
    next_event() returns a Request, Data, END, NEED_DATA or PEER_CLOSED, or
    raises RequestError (status and reason) for a request to refuse.
    response_head() / response_data() / response_end() turn the
    application's response into bytes; start_next_cycle() readies the
    connection for the next request once both sides are DONE.
    """

    #: a response of unknown length on HTTP/1.1 is chunked (False: it ends
    #: with the close, as forkserve.http.uwsgi's responses do)
    chunk_responses = True

    #: the C fast paths of _next_head and response_head (None: Python only)
    _fast_parse = _H1.parse_head if _H1 is not None else None
    _fast_build = _H1.build_head if _H1 is not None else None

    def __init__(self, limits, environ_base=None):
        self.limits = limits
        #: the part of the WSGI environ that is the same for every request on
        #: this connection, with an empty SCRIPT_NAME, or None: given it, the
        #: C parser makes each usual request's whole environ (Request.environ)
        self.environ_base = environ_base
        self._keep_alive_allowed = bool(limits.keep_alive)
        # what the C steps (ConnectionBase) read of the limits and the class
        self._head_max, self._fields_max = limits.fast_head_max, limits.fields_max
        self._c_parse = self._fast_parse is not None
        self._c_build = self._fast_build is not None
        self._chunk_responses = bool(self.chunk_responses)
        self.their_state = IDLE
        self.our_state = IDLE
        self.request = None
        #: False once the connection must close after the current response
        self.keep_alive = True
        #: what the application did wrong with its body's framing (for the log)
        self.response_problem = None
        self._buf = b""
        self._pos = 0
        self._eof = False
        self._lines = None        # a head read line by line: [request, fields, blank lines]
        self._left = 0            # body bytes left (of the current chunk, if chunked)
        self._chunk_state = None  # chunked: "size", "data", "crlf", "trailer"
        self._body_total = 0
        self._continue = False    # a 100 Continue is owed before the first body read
        self._no_body = False     # HEAD, 204, 304: the response carries no body
        self._declared = None     # bytes the response's Content-Length still expects
        self._chunked = False     # the response body is chunked
        self.sent = 0             # response body bytes sent (the access log's %(B)s)
        self.code = None          # the response's status code, once its head is built
        #: the server drains (reload, stop, --max-requests): the next response
        #: closes, unless another request is already pipelined behind it
        self.draining = False
        #: why reading the request body failed (a RequestError to answer, or
        #: ClientDisconnected), once it did: the connection then closes
        self.body_error = None

    # --- bytes in ---------------------------------------------------------------

    @property
    def trailing_data(self):
        """The bytes received and not consumed yet (as h11 names them)."""
        return self._buf[self._pos:]

    def take(self, size):
        """Up to `size` of the bytes received and not consumed, consumed: for
        what precedes the first request on a connection (a PROXY protocol
        header, forkserve.http.proxy), which is not HTTP."""
        if self.their_state is not IDLE or self.request is not None:
            raise RuntimeError("take() reads what comes before the first request")
        pos = self._pos
        self._pos = min(pos + size, len(self._buf))
        return self._buf[pos:self._pos]

    @property
    def continue_pending(self):
        """True while the client waits for 100 Continue before sending the body."""
        return self._continue

    def send_continue(self):
        """The 100 Continue to send before the first read of the body."""
        self._continue = False
        return _CONTINUE

    def _next_event(self, max_bytes=None):
        """next_event(), for what the C step does not take (ConnectionBase)."""
        state = self.their_state
        try:
            if state is IDLE or state is HEAD:
                return self._next_head()
            if state is BODY:
                return self._next_body(max_bytes)
        except RequestError:
            self.their_state = ERROR
            self.keep_alive = False
            raise
        if state is DONE:
            return END
        if state is ERROR:
            raise RuntimeError("the connection refused a request: answer refusal() and close")
        return PEER_CLOSED

    # --- the head

    def _next_head(self):
        buf, pos = self._buf, self._pos
        if pos == len(buf):
            if self._eof:
                self.their_state = CLOSED
                return PEER_CLOSED
            return NEED_DATA
        self.their_state = HEAD
        limits = self.limits
        if self._lines is None:
            # the usual case: the whole head is here, no line is near a limit,
            # and every line is in its usual form: one match for all of it (the
            # C step, ConnectionBase.next_event, tried its own before this)
            end = buf.find(b"\r\n\r\n", pos, pos + limits.fast_head_max)
            if end >= 0:
                head = request_head(buf[pos:end + 2].decode("latin-1"))
                if head is not None:
                    self._pos = end + 4
                    return self._head_done(*head)
            self._lines = [None, [], 0]
        while True:  # line by line, each checked against its limit as it comes
            buf, pos = self._buf, self._pos
            limit = limits.line_max + 2 if self._lines[0] is None else limits.field_size_max
            found = buf.find(b"\n", pos, pos + limit)
            if found < 0:
                if len(buf) - pos < limit:
                    if self._eof:
                        self.their_state = CLOSED
                        return PEER_CLOSED
                    return NEED_DATA
                end = pos + limit  # over its limit: the grammar refuses it
            else:
                end = found + 1
            self._pos = end
            line = buf[pos:end]
            request, fields, blank = self._lines
            if request is None:
                if line == b"\r\n" and blank < BLANK_LINES:
                    self._lines[2] += 1  # an empty line before the request line (RFC 9112 2.2)
                    continue
                self._lines[0] = request_line(line, limits.line_max)
            elif line == b"\r\n":
                self._lines = None
                return self._head_done(*request, fields)
            else:
                if len(fields) == limits.fields_max:
                    raise RequestError(431, f"more than {limits.fields_max} header fields")
                fields.append(header_field(line, limits.field_size_max))

    def _head_done(self, method, target, version, text, fields):
        """The request of a head read whole: its fields (name, value pairs)
        keyed as the environ keys them, and the head's rules applied."""
        fields_max = self.limits.fields_max
        if len(fields) > fields_max:
            raise RequestError(431, f"more than {fields_max} header fields")
        headers = {}
        repeated = None  # key -> every value, for a field that came more than once (rare)
        for name, value in fields:
            key = _FIELD_KEYS.get(name)
            if key is None:
                if "_" in name:
                    continue  # dropped, as Gunicorn drops it: X_Forwarded_For must not pose as X-
                key = "HTTP_" + name.upper().replace("-", "_")
            if key in headers:
                if key == "HTTP_CONTENT_TYPE":
                    raise RequestError(400, "more than one Content-Type header")
                if repeated is None:
                    repeated = {}
                repeated.setdefault(key, [headers[key]]).append(value)
                headers[key] += ("; " if key == "HTTP_COOKIE" else ",") + value
            else:
                headers[key] = value
        # Content-Type and Content-Length are the two keys without HTTP_ (PEP 3333)
        if "HTTP_CONTENT_TYPE" in headers:
            headers["CONTENT_TYPE"] = headers.pop("HTTP_CONTENT_TYPE")
        lengths = None
        if "HTTP_CONTENT_LENGTH" in headers:
            lengths = [headers.pop("HTTP_CONTENT_LENGTH")]
            if repeated is not None and "HTTP_CONTENT_LENGTH" in repeated:
                lengths = repeated["HTTP_CONTENT_LENGTH"]
            headers["CONTENT_LENGTH"] = lengths[-1]
        path, query, authority = request_target(method, target)
        host = headers.get("HTTP_HOST")
        if host is None:
            if version == "HTTP/1.1":
                raise RequestError(400, "HTTP/1.1 request without a Host header")
        elif repeated is not None and "HTTP_HOST" in repeated:
            raise RequestError(400, "more than one Host header")
        elif not valid_host(host):
            raise RequestError(400, f"invalid Host {escape(host[:60])}")
        connection = headers.get("HTTP_CONNECTION")
        if connection is None:
            keep = version != "HTTP/1.0"
        else:
            known = _ONE_TOKEN.get(connection)  # what clients and proxies send: one token
            if known is not None:
                keep = known[version == "HTTP/1.1"]
            else:
                tokens = {t.strip(" \t").lower() for t in connection.split(",")}
                # close wins, whatever else the list holds (RFC 9112 9.6)
                keep = "close" not in tokens and (version == "HTTP/1.1" or "keep-alive" in tokens)
        return self._framed(Request(method, target, version, text, headers, path, query,
                                    authority), lengths, keep)

    def _framed(self, request, lengths, keep):
        """`request`, a head whose fields and target were checked, with its
        body's framing decided and the connection's keep-alive (`keep`, what
        the request asks) settled. `lengths`: the Content-Length values."""
        self.keep_alive = keep and self._keep_alive_allowed
        self._no_body = request.method == "HEAD"
        self.request = request
        headers = request.headers
        transfer_encoding = headers.get("HTTP_TRANSFER_ENCODING")
        if transfer_encoding is None and lengths is None:  # no body: the usual request
            self.their_state = DONE
            self._continue = False
            return request
        version = request.version
        chunked, length = body_framing(version, transfer_encoding, lengths or [],
                                       self.limits.limit_request_body)
        self._continue = expect = bool(
            (chunked or length) and version == "HTTP/1.1"
            and headers.get("HTTP_EXPECT", "").lower() == "100-continue")
        self._body_total = 0
        if chunked:
            self.their_state, self._chunk_state, self._left = BODY, "size", 0
        elif length:
            self.their_state, self._left = BODY, length
        else:
            self.their_state = DONE
        request.chunked = chunked
        request.length = None if chunked else length
        request.expect_continue = expect
        return request

    # --- the body

    def _next_body(self, max_bytes):
        if self._chunk_state is None:  # Content-Length
            available = len(self._buf) - self._pos
            if not available:
                return PEER_CLOSED if self._eof else NEED_DATA
            return self._take(min(available, self._left, max_bytes or self._left))
        while True:
            step = self._chunk_state
            if step == "data":
                available = len(self._buf) - self._pos
                if not available:
                    return PEER_CLOSED if self._eof else NEED_DATA
                return self._take(min(available, self._left, max_bytes or self._left))
            line = self._line(2 if step == "crlf" else CHUNK_LINE_MAX + 2 if step == "size"
                              else self.limits.field_size_max, step)
            if line is None:
                return PEER_CLOSED if self._eof else NEED_DATA
            if step == "crlf":
                if line != b"\r\n":
                    raise RequestError(400, "chunk data not followed by CRLF")
                self._chunk_state = "size"
            elif step == "size":
                size = chunk_size(line)
                if size == 0:
                    self._chunk_state, self._left = "trailer", 0
                    continue
                self._body_total += size
                body_max = self.limits.limit_request_body
                if body_max and self._body_total > body_max:
                    raise RequestError(413, f"chunked body over the {body_max}-byte limit")
                self._chunk_state, self._left = "data", size
            elif line == b"\r\n":
                self.their_state, self._chunk_state = DONE, None
                return END
            else:  # a trailer field; _left counts them here
                self._left += 1
                if self._left > self.limits.fields_max:
                    raise RequestError(431, "too many trailer fields")
                name, _ = header_field(line, self.limits.field_size_max)
                if not trailer_allowed(name):
                    raise RequestError(400, f"{escape(name)} is not allowed in a trailer")
                # any other trailer field is dropped: the environ was built from the head

    def _line(self, limit, step):
        """The next line, up to `limit` bytes; a longer one as `limit` bytes
        (the grammar refuses it); None until it is all here."""
        buf, pos = self._buf, self._pos
        found = buf.find(b"\n", pos, pos + limit)
        if found < 0:
            if len(buf) - pos < limit:
                return None
            end = pos + limit
            if step == "crlf":
                raise RequestError(400, "chunk data not followed by CRLF")
        else:
            end = found + 1
        self._pos = end
        return buf[pos:end]

    def _take(self, size):
        pos = self._pos
        self._pos = pos + size
        self._left -= size
        if not self._left:
            if self._chunk_state is None:
                self.their_state = DONE
            else:
                self._chunk_state = "crlf"
        return Data(self._buf[pos:pos + size])

    # --- bytes out --------------------------------------------------------------

    def drain(self):
        """The server is draining: the next response says `Connection: close`,
        unless the client already sent another request (pipelined)."""
        self.draining = True

    def body_failed(self, error):
        """Reading the request body failed with `error` (a RequestError, whose
        status answers the request, or ClientDisconnected): the connection
        closes after the response, as after any request not read whole."""
        if self.body_error is None:
            self.body_error = error
        self.their_state = ERROR
        self.keep_alive = False

    def wants_peek(self):
        """True if the keep-alive decision depends on bytes that may be readable
        now: the rest of a small unread body, or (draining) a pipelined request.
        The driver then feeds what it can read without waiting."""
        state = self.their_state
        if state is DONE:
            return self.draining and not self.buffered
        if state is BODY:
            return (self._chunk_state is None and self._left <= DISCARD_BYTES
                    and not self._continue and self.buffered < self._left)
        return False

    def response_head(self, status, headers, body, total, date):
        """The response head for the application's `status` and `headers`,
        joined with the first body bytes `body`; `total` is the body's whole
        length if known, `date` the Date value (used if the application gave
        none). Decides keep-alive (see the module's invariants). Raises
        ApplicationError for a status or header the application may not send.
        """
        keep = self.their_state is DONE and self.keep_alive and not self.draining \
            or self._reusable()
        head = self._head(status, headers, total, keep, date)
        if self._no_body or not body:
            return head
        if self._chunked:
            return head + self.response_data(body)
        size = len(body)
        declared = self._declared  # framed by total (None), or by the application's length
        if declared is not None:
            if size > declared:
                return head + self.response_data(body)
            self._declared = declared - size
        self.sent += size
        return head + body

    def _whole_response(self, status, headers, body, date):
        """whole_response(): response_head() with all of the body, `body`,
        and response_end() in one: the whole response, ended, for an
        application that gave its body at once. None, and nothing decided,
        while the keep-alive decision may depend on bytes that could be
        readable now (wants_peek, or a request not received whole): the
        driver then takes those steps. The C step (ConnectionBase) builds the
        usual response itself and calls this for the rest."""
        if self.their_state is not DONE or self.draining:
            return None
        size = len(body)
        head = self._head(status, headers, size, self.keep_alive, date)
        if self._no_body:
            self.our_state = DONE
            return head
        declared = self._declared  # None: framed by its length; else the application's
        if declared is not None and declared != size:  # cut, or closed short
            return head + self.response_data(body) + self.response_end()
        self._declared = None
        self.our_state = DONE
        self.sent = size
        return head + body

    def _head(self, status, headers, total, keep, date):
        """The response head (see response_head), keep-alive settled from
        `keep` (what the request and the server allow); the response is
        under way."""
        version = self.request.version
        chunk_ok = self.chunk_responses and version == "HTTP/1.1"
        fast = self._fast_build
        built = None if fast is None else fast(status, headers, total, chunk_ok,
                                               version == "HTTP/1.0", self._no_body, keep, date)
        if built is None:  # no C, or a head it leaves to the checks of the Python code
            built = build_head(status, headers, total, chunk_ok, version == "HTTP/1.0",
                               self._no_body, keep, date)
        code, head, self._declared, self._chunked, self.keep_alive = built
        self._no_body = self._no_body or code in (204, 304)
        self.our_state = SEND_BODY
        self.code = code
        return head

    def _reusable(self):
        if not self.keep_alive:
            return False
        if self.their_state is BODY:
            # the rest of the body must be here and small: skipping it can't wait
            if self._chunk_state is not None or self._continue or self._left > DISCARD_BYTES \
                    or self.buffered < self._left:
                return False
        elif self.their_state is not DONE:
            return False
        return not (self.draining
                    and self.buffered <= (self._left if self.their_state is BODY else 0))

    def response_data(self, data):
        """`data` framed as the response head said (chunked, or counted
        against the application's Content-Length and cut at it)."""
        if self._no_body:
            return b""
        left = self._declared
        if left is not None:
            if len(data) > left:
                self.response_problem = ("application sent more than its Content-Length; "
                                         "truncated and closing")
                self.keep_alive = False
                data = data[:left]
            self._declared = left - len(data)
        self.sent += len(data)
        if self._chunked:
            return b"%x\r\n%b\r\n" % (len(data), data)
        return data

    def response_file(self, count):
        """Account for `count` bytes of a file sent by the driver as they are
        (sendfile); returns (prefix, count, suffix): the bytes before and after
        them and how many of the file to send."""
        if self._no_body:
            return b"", 0, b""
        if self._declared is not None:
            count = min(count, self._declared)
            self._declared -= count
        self.sent += count
        if self._chunked and count:
            return b"%x\r\n" % count, count, b"\r\n"
        return b"", count, b""

    def response_end(self):
        """The bytes that end the response body; the response is DONE."""
        self.our_state = DONE
        if self._declared:
            self.response_problem = (f"application sent {self._declared} bytes fewer than its "
                                     "Content-Length; closing")
            self.keep_alive = False
        return b"0\r\n\r\n" if self._chunked and not self._no_body else b""

    def response_cut(self):
        """The response ended early (an error after its head went out, or the
        client left): the connection must close."""
        self.our_state = DONE
        self.keep_alive = False

    def refusal(self, status):
        """A complete plain-text error response that closes the connection."""
        self.keep_alive = False
        self.our_state = DONE
        return plain_response(f"{status} {REASONS[status]}", REASONS[status].encode())

    @property
    def unread_body(self):
        """True if the request body was not received to its end."""
        return self.their_state is BODY or self.their_state is ERROR
