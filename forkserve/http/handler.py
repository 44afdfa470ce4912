"""One HTTP/1.x connection of a forkserve worker: read a request, run the WSGI
application (PEP 3333), send the response, repeat while keep-alive allows.

The Handler is a thin driver: what the bytes mean, the framing, the limits,
100-continue and the keep-alive decision are the connection object's
(forkserve.http.protocol.Connection, which does no I/O); the socket, its
timers and the lingering close are forkserve.http.transport's; the WSGI
response is forkserve.http.responder's. The Handler feeds the connection
object what the socket brings, under the right timer, and turns its events
into an environ and a response. Nothing here subclasses or reaches into a
gevent class.

Invariants, and why:

- A refused connection is never read from again as HTTP. Its close lingers
  briefly (transport.LINGER_SECONDS) so the client reads the error instead
  of a reset; so does the close after a request whose body was not read to
  its end.
- Draining (reload, stop, --max-requests reached): the next response on every
  connection says `Connection: close`, unless the client already sent another
  request on it (pipelined), which is answered too. Idle connections are not
  closed early: the client may be sending its next request right now; they
  close after `keep_alive` idle seconds like any other, and the server's
  graceful timeout force-closes what remains.
- An idle keep-alive connection is closed only if nothing has arrived on it
  when its timer runs: libev runs a due timer before the read that became
  ready in the same turn (a worker busy past the deadline), and closing on a
  request that came in time reset the client's connection.
- Timers bound every wait on the client, and none runs while the application
  does: idle (keep_alive) between requests, header_timeout from a request's
  first byte (or the connection's first wait for one) to its last header line,
  body_timeout for the whole request body from the application's first read,
  send_timeout for each stall of the response (a client that takes no byte).
  The keep-alive wait counts from when the last response was written whole
  (the hub may finish writing one long after it was handed over).
"""

import time

from gevent import sleep

from forkserve.http.body import EMPTY_BODY, Body, buffered
from forkserve.http.environ import request_environ
from forkserve.http.h1 import ClientDisconnected, Limits, RequestError
from forkserve.http.protocol import IDLE, NEED_DATA, Request
from forkserve.http.responder import Responder
from forkserve.http.response import FileWrapper
from forkserve.http.transport import GONE_ERRNOS, Expired, Transport, timer

__all__ = ["Limits", "Handler", "ErrorStream", "FileWrapper", "RequestError",
           "ClientDisconnected"]

#: A connection yields to the event loop after this many requests in a row.
#: gevent only switches greenlets when a socket would block, and a client
#: that pipelines keeps data waiting: without the yield its greenlet ran for
#: seconds, starving the other connections and the worker's heartbeat, and
#: the master killed the "blocked" worker (connections reset mid-blast).
YIELD_EVERY = 16


class Shed(Expired):
    """Thrown into a connection waiting for its request head, to free its
    descriptor for a new client (forkserve.http.shortage)."""


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
        if connection is not None and connection.http.body_error is not None \
                and self.TRACEBACK in text:
            return
        self._logger.error("%s", text)

    def writelines(self, lines):
        for line in lines:
            self.write(line)

    def flush(self):
        pass


class Preamble:
    """What a connection brings before its first request (a PROXY protocol
    header), read as forkserve.http.proxy reads a file (peek, read,
    readline, as io.BufferedReader has them) from the connection object's
    buffer, the one receive buffer: what follows the header stays there for
    the first request."""

    __slots__ = ("_http", "_recv")

    def __init__(self, http, recv):
        self._http = http
        self._recv = recv

    def _fill(self):
        """One more read into the connection's buffer; False at EOF."""
        data = self._recv()
        self._http.receive_data(data)
        return bool(data)

    def peek(self, size=1):
        """What is buffered: one read's bytes if nothing is (b"" at EOF)."""
        if not self._http.buffered:
            self._fill()
        return self._http.trailing_data

    def read(self, size):
        """`size` bytes, fewer only at EOF."""
        while self._http.buffered < size and self._fill():
            pass
        return self._http.take(size)

    def readline(self, limit):
        """Up to and including the next LF, at most `limit` bytes (fewer at EOF)."""
        while True:
            data = self._http.trailing_data
            end = data.find(b"\n", 0, limit)
            if end >= 0:
                return self._http.take(end + 1)
            if len(data) >= limit or not self._fill():
                return self._http.take(limit)


class Handler:
    """Serves one connection: a loop of read head -> run app -> respond."""

    def __init__(self, sock, address, server):
        self.server = server
        self.socket = sock
        self.client_address = address
        self.peer = address[0] if isinstance(address, tuple) and address else "unix"
        limits = server.limits
        #: the environ's part that is the same for every request on this connection
        self.base_env = env = server.base_env.copy()
        env["wsgi.errors"] = ErrorStream(server.logger, self)
        env["wsgi.input"] = EMPTY_BODY  # replaced for a request with a body
        if isinstance(address, tuple):
            env["REMOTE_ADDR"] = address[0]
            env["REMOTE_PORT"] = str(address[1])
        # the scheme headers to look for: none if this peer may not set the scheme
        self._scheme_keys = server.proxy.scheme_keys(address)
        tls = server.tls  # the TLS seam: a TLS listener's connections seal and open
        self.transport = Transport(sock, server.loop, limits.send_timeout, server.outbox) \
            if tls is None else tls.transport(sock, server.loop, limits.send_timeout,
                                              server.outbox, self.peer)
        # HTTP/1.1, or forkserve.http.uwsgi; without a SCRIPT_NAME to take off
        # the path, the usual request's environ is made as its head is parsed
        self.http = server.connection_class(limits, None if env["SCRIPT_NAME"] else env)
        self.responder = Responder(self.http, self.transport, server, self.peer)
        # made when the connection first waits for a request head: most
        # connections' first request came with them (read before any wait)
        self._head_timer = None
        # made when the connection first waits for a second request: with one
        # request per connection (Connection: close, a proxy's uwsgi_pass)
        # it is never needed
        self._idle_timer = None
        self._body_deadline = None
        #: time.monotonic() since when the request head is awaited under the
        #: header timeout (None otherwise): such a connection may be shed
        self.head_started = None
        self._head_waiting = False
        #: time.perf_counter() when the current request began: its first byte
        #: after a keep-alive wait, else when its head was looked for
        self._started = 0.0

    def handle(self):
        try:
            request = self._receive_head(True)
            served = 0
            while request is not None and self._serve(request):
                served += 1
                if not served % YIELD_EVERY:
                    sleep(0)
                request = self._next_kept()
        except ClientDisconnected:
            pass
        finally:
            for each in (self._head_timer, self._idle_timer):
                if each is not None:
                    each.close()
            try:
                self.transport.close()
            finally:
                cut = self.transport.cut  # a held response the hub stopped writing
                if cut is not None:
                    self.server.cuts.report(self.peer, *cut)
                # Two cycles: wsgi.errors (an ErrorStream, in the base environ
                # and in the last request's) refers back to this handler, and
                # the responder's bound methods to the responder. Break them
                # so the connection is freed now, not by a collection that may
                # never come (--worker-gc off, a master-frozen heap); an
                # environ the application kept keeps its stream (which no
                # longer leads to this greenlet: the transport dropped its
                # throw).
                self.responder.close()
                self.base_env = self.http.environ_base = self.http.request = None

    def abort(self):
        """Shut the connection down (the server's close_now)."""
        self.transport.abort()

    def shed(self):
        """Close this connection soon if it is still waiting for its request
        head: 408, no lingering (the point is to free its descriptor now).
        Runs from the hub, where the head wait is the only place the
        connection's greenlet can be while head_started is set."""
        self.head_started = None  # shed once

        def throw():
            if self.transport.socket is not None and self._head_waiting:
                self.transport.throw(Shed)
        self.server.loop.run_callback(throw)

    def _serve(self, request):
        """Run and answer `request`; True if the connection stays open."""
        server, http = self.server, self.http
        env = request.environ
        try:
            if env is None:  # not made by the parser
                env = request_environ(self.base_env, request)
            for key in self._scheme_keys:
                if key in env:
                    server.proxy.set_scheme(env)
                    break
        except RequestError as ex:  # outside SCRIPT_NAME; contradicting scheme headers
            return self._refuse(ex)
        spooled = None
        length = request.length
        if length:  # without a body, wsgi.input is the base environ's EMPTY_BODY
            self._body_deadline = None
            env["wsgi.input"] = Body(http, self._fill_body)
        elif length is None:  # chunked: read whole, so the environ says how long it is (body.buffered)
            self._body_deadline = None
            try:
                spooled, size = buffered(Body(http, self._fill_body))
            except RequestError as ex:  # a bad chunk, too large, too slow
                return self._refuse(ex)
            env["CONTENT_LENGTH"] = str(size)
            del env["HTTP_TRANSFER_ENCODING"]  # the application's input is not chunked
            env["wsgi.input"] = spooled
        responder = self.responder
        server.active_requests += 1
        try:
            responder.respond(env, request.line)
        finally:
            server.active_requests -= 1
            if spooled is not None:
                spooled.close()
        on_request = server.on_request
        if on_request is not None:
            try:
                on_request()
            except Exception:
                server.logger.exception("on_request callback failed")
        sink = server.access_sink
        if sink is not None:  # the access log: a line for a request the application saw
            code = responder.code
            sink(env, request.line, code, responder.headers if responder.headers_sent else (),
                 http.sent if code else None, self._started)
        if http.start_next_cycle():
            return True
        if isinstance(http.body_error, RequestError):  # answered with its status
            self._log_refusal(http.body_error)
        self.transport.linger = http.unread_body  # the client may still be sending
        return False

    def _next_kept(self):
        """The next request on a connection kept alive, or None if it should
        close: the usual case here (nothing buffered: wait for the next
        request under the keep_alive timer, read it, parse it), the rest (a
        pipelined request, a head that comes in parts) in _receive_head."""
        http = self.http
        if http.buffered:  # pipelined: the request began when the last one ended
            return self._receive_head(False)
        transport = self.transport
        idle_timer = self._idle_timer
        try:
            if idle_timer is None:
                idle_timer = self._idle_timer = timer(self.server.loop,
                                                      self.server.limits.keep_alive)
            if idle_timer is None:
                data = transport.reader.recv(True)
            else:
                idle_timer.again(transport.throw, Expired)
                try:
                    data = transport.reader.recv(True)
                except Expired:
                    idle_timer.stop()  # a repeating timer would run again
                    data = self._after_idle_timer()
                finally:
                    idle_timer.stop()
            # the request begins now: the keep-alive wait is not part of it
            self._started = time.perf_counter()
            http.receive_data(data)
            event = http.next_event()
        except Expired:  # a quiet close: nothing of a request arrived
            return None
        except RequestError as ex:
            return self._refuse(ex)
        except OSError as ex:
            if ex.errno in GONE_ERRNOS:
                return None
            raise
        if event is NEED_DATA:  # a head in parts: wait for the rest under header_timeout
            return self._receive_head(False, begun=True)
        return event if isinstance(event, Request) else None

    def _after_idle_timer(self):
        """The keep-alive timer ran: the first bytes of the next request if
        they came after all, else Expired. The wait counts from when the last
        response was written whole, so it goes on while the hub still writes
        it to a slow reader, and for what is left of keep_alive after that."""
        transport = self.transport
        expiry = None
        try:
            while True:
                # The loop may run the timer before the read it has pending:
                # a request that came in time (while the worker was busy) is
                # served, not closed on (an RST).
                data = transport.read_now()
                if data is not None:
                    return data
                left = transport.idle_left(self.server.limits.keep_alive)
                if left <= 0:
                    raise Expired
                if expiry is not None:
                    expiry.close()
                expiry = self.server.loop.timer(left)
                expiry.start(transport.throw, Expired)
                try:
                    return transport.reader.recv(True)
                except Expired:
                    pass
        finally:
            if expiry is not None:
                expiry.close()

    def _receive_head(self, first, begun=False):
        """Wait for a request and read its head; None if the connection
        should close (EOF, timeout, refusal). `first`: the connection's
        first request; else one is pipelined (buffered), or part of one
        arrived (`begun`: at self._started)."""
        http, reader = self.http, self.transport.reader
        throw = self.transport.throw
        head_timer = self._head_timer
        head_armed = False
        try:
            try:
                if first:
                    self._started = time.perf_counter()
                    proxy = self.server.proxy
                    if proxy.protocol != "off":  # its header comes before the first request
                        head_timer = self._head_timer_armed(throw)
                        head_armed = self._head_waiting = True
                        self.head_started = time.monotonic()
                        # the client it names is every request's on this connection
                        proxy.set_client(self.base_env, proxy.read_header(
                            Preamble(http, reader.recv), self.client_address))
                        # what came with the header, if anything, is the request's
                        event = http.next_event() if http.buffered else NEED_DATA
                    else:
                        # usually the request came with the connection: no timer
                        # unless it must be waited for
                        data = self.transport.read_now()
                        if data is None:
                            event = NEED_DATA
                        else:
                            http.receive_data(data)
                            event = http.next_event()
                elif begun:  # its first bytes came after a keep-alive wait (_next_kept)
                    event = NEED_DATA
                else:  # pipelined: the request began when the last one ended
                    self._started = time.perf_counter()
                    event = http.next_event()
                while event is NEED_DATA:
                    if not head_armed:
                        head_timer = self._head_timer_armed(throw)
                        head_armed = self._head_waiting = True
                        self.head_started = time.monotonic()
                    http.receive_data(reader.recv())
                    event = http.next_event()
            finally:
                self._head_waiting, self.head_started = False, None
                if head_armed and head_timer is not None:
                    head_timer.stop()
        except Shed:  # counted in the server's shortage line, not logged one by one
            if http.their_state is not IDLE:
                self._refuse(RequestError(408, "request head not received before descriptors "
                                               "ran short"), linger=False, log=False)
            return None
        except Expired:
            if http.their_state is not IDLE:  # quiet close unless part of a request arrived
                self._refuse(RequestError(408, "request head not received in time"), linger=False)
            return None
        except RequestError as ex:
            return self._refuse(ex)
        except OSError as ex:
            if ex.errno in GONE_ERRNOS:
                return None
            raise
        return event if isinstance(event, Request) else None

    def _head_timer_armed(self, throw):
        """The header_timeout timer, made if this is the connection's first
        wait for a head, armed to throw Expired; None without a timeout."""
        head_timer = self._head_timer
        if head_timer is None:
            head_timer = self._head_timer = timer(self.server.loop,
                                                  self.server.limits.header_timeout)
        if head_timer is not None:
            head_timer.again(throw, Expired)
        return head_timer

    def _refuse(self, error, linger=True, log=True):
        """Answer a refused request with its status and close."""
        if log:
            self._log_refusal(error)
        try:
            self.transport.send(self.http.refusal(error.status))
        except ClientDisconnected:
            return None
        self.transport.linger = linger
        return None

    def _fill_body(self):
        """Give the connection object more of the request body: sends 100
        Continue first if the client waits for it, and bounds the whole body
        by body_timeout."""
        http, transport = self.http, self.transport
        if http.continue_pending:
            transport.send(http.send_continue())
        timeout = self.server.limits.body_timeout
        if not timeout:
            http.receive_data(self._recv_body())
            return
        now = time.monotonic()
        if self._body_deadline is None:
            self._body_deadline = now + timeout
        left = self._body_deadline - now
        if left <= 0:
            raise RequestError(408, f"request body not received within {timeout:g} s "
                                    "(--body-timeout)")
        expiry = self.server.loop.timer(left)
        expiry.start(transport.throw, Expired)
        try:
            http.receive_data(self._recv_body())
        except Expired:
            raise RequestError(408, f"request body not received within {timeout:g} s "
                                    "(--body-timeout)") from None
        finally:
            expiry.close()

    def _recv_body(self):
        try:
            return self.transport.reader.recv()
        except OSError as ex:
            if ex.errno not in GONE_ERRNOS:
                raise
            raise ClientDisconnected("client went away while sending the body") from ex

    def _log_refusal(self, error):
        self.server.logger.info("refused request from %s: %d %s",
                                self.peer, error.status, error.reason)
