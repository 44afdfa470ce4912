"""The HTTP server each worker (or single-process mode) runs on the gevent loop.

It serves on a listener it is given (never binds). A new connection costs
what the kernel's accept and close cost plus a few Python objects, because
most deployments open one per request (nginx's default proxy_pass, its
uwsgi_pass): the listener is watched by a loop io watcher, whose callback,
in the hub, takes every pending connection in one pass (up to
`max_accept`, for up to `pass_seconds`), each as a plain non-blocking socket (`Accepted`, no gevent
socket wrapper and its two watchers), and switches at once into a new
greenlet that runs a forkserve.http.handler.Handler on it; the callback
goes on when that greenlet first waits (usually once its response is
written and the connection closed). Before each accept the process's
`Connections` (one cap per worker, --worker-connections, shared by its
listeners) and its Admission (forkserve.process.balance) are asked; if
either says no, the watcher is stopped until a connection ends or the
balance's tick passes. Only gevent's public API is used: its loop's io and
timer watchers, its hub, and greenlets.

A listener that must wrap a new socket (TLS) overrides `connection_socket`;
it may return a gevent socket, the slower path: the handler only needs
fileno, shutdown, close, and a cooperative sendall and recv.

Stopping: drain() stops accepting and lets every connection end on its own
(see the handler's drain rules: the next response says Connection: close, an
idle connection closes after keep_alive) until a timeout, then close_now()
cuts what remains. retire() stops accepting and makes every further response
close its connection, without waiting (--max-requests reached).
stop_accepting() never switches: it may run from a loop callback.
"""

import errno
import fcntl
import logging
import os
import socket
import sys
import termios
import time

from gevent import getcurrent, get_hub
from gevent.event import Event
from gevent.socket import wait_read, wait_write
from greenlet import GreenletExit, greenlet

import forkserve
from forkserve.http.accesslog import AccessFormat
from forkserve.http.cuts import CutLog
from forkserve.http.handler import ErrorStream, FileWrapper, Handler, Limits
from forkserve.http.protocol import Connection
from forkserve.http.proxy import ProxyPolicy
from forkserve.http.shortage import DESCRIPTOR_ERRNOS, SHED_BATCH, ShortageLog, oldest_heads

__all__ = ["Server", "Connections", "Accepted", "needs_nodelay"]

# setsockopt on a just-accepted socket fails with these when the client is
# already gone; nothing to do about it, the handler will see EOF.
_SETSOCKOPT_GONE = frozenset({errno.EINVAL, errno.ECONNRESET, errno.ENOTCONN, errno.EBADF})
# accept() failures that concern one connection (gone before we took it) or
# a momentary shortage; the server keeps accepting.
_ACCEPT_SKIP = frozenset({errno.ECONNABORTED, errno.EPROTO, errno.EPERM, errno.EINTR})
_ACCEPT_SHORTAGE = DESCRIPTOR_ERRNOS | {errno.ENOBUFS, errno.ENOMEM}
#: seconds to wait before accepting again when out of descriptors or memory
#: and no connection could be shed (forkserve.http.shortage)
SHORTAGE_PAUSE = 0.1


def needs_nodelay(listener):
    """True if sockets accepted from `listener` must get TCP_NODELAY set.

    Without it, a response written in two sends (headers, body) waits for the
    client's delayed ACK: ~40 ms per keep-alive request. Linux copies the
    option from the listener to accepted sockets, so there we only pay the
    per-connection syscall when the listener lacks it.
    """
    if listener.family not in (socket.AF_INET, socket.AF_INET6):
        return False
    if not sys.platform.startswith("linux"):
        return True
    return not listener.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)


class Accepted(socket.socket):
    """An accepted connection's socket: the stdlib's, non-blocking, with the
    two calls that may wait made cooperative (they wait on the gevent loop).
    The handler reads and writes its descriptor directly
    (forkserve.http.transport); these serve the rare waits: the rest of a
    response the socket did not take at once, the lingering close."""

    __slots__ = ()

    def sendall(self, data):
        view = memoryview(data)
        while view:
            try:
                sent = self.send(view)
            except BlockingIOError:
                wait_write(self.fileno())
                continue
            view = view[sent:]

    def recv(self, size, flags=0):
        while True:
            try:
                return super().recv(size, flags)
            except BlockingIOError:
                wait_read(self.fileno())


class Connections:
    """The connections of one serving process, across its listeners: the
    greenlets serving them, at most `limit` (--worker-connections), and the
    servers paused until one of them ends (out of room, or over their share
    of the balance)."""

    def __init__(self, limit):
        self.limit = limit
        self.greenlets = set()
        self._when_one_ends = []
        self._all_ended = None  # an Event while join() waits

    def __len__(self):
        return len(self.greenlets)

    def __contains__(self, glet):
        return glet in self.greenlets

    def full(self):
        return len(self.greenlets) >= self.limit

    def started(self, glet):
        self.greenlets.add(glet)

    def ended(self, glet):
        """`glet` has finished: wake what waits for room. Runs in `glet`,
        and what it runs never switches."""
        self.greenlets.discard(glet)
        waiting = self._when_one_ends
        if waiting:
            self._when_one_ends = []
            for callback in waiting:
                callback()
        if not self.greenlets and self._all_ended is not None:
            self._all_ended.set()

    def when_one_ends(self, callback):
        """Call `callback()` (once) when the next connection ends."""
        if callback not in self._when_one_ends:
            self._when_one_ends.append(callback)

    def join(self, timeout):
        """Wait up to `timeout` seconds for every connection to end; True if they did."""
        if not self.greenlets:
            return True
        if self._all_ended is None:
            self._all_ended = Event()
        else:
            self._all_ended.clear()  # set by an earlier join's end
        return self._all_ended.wait(timeout)

    def kill(self):
        """Throw GreenletExit into every connection's greenlet, from the hub
        (never from here: this may run in one of them)."""
        loop = get_hub().loop
        for glet in list(self.greenlets):
            loop.run_callback(_kill, glet)


def _kill(glet):
    """GreenletExit into `glet` unless it has ended meanwhile (a throw into a
    dead greenlet would be raised in its parent, the hub)."""
    if not glet.dead:
        glet.throw()


class Server:
    """Serve `app` on an already bound and listening gevent socket.

    `on_request()` runs after every response to a request the application saw
    (it must not block; to stop the server from it, spawn a greenlet that
    calls drain()). `access_log`, if a Logger, gets one combined-format line
    per such request; `error_log` gets refusals (INFO, one line), framing
    warnings and application tracebacks (ERROR) and is wsgi.errors.
    """

    handler_class = Handler

    def __init__(self, listener, app, *, worker_connections=1000, limits=None,
                 access_log=None, error_log=None, multiprocess=True,
                 on_request=None, server_name=None, connections=None, access_format=None,
                 access_sink=None, proxy=None, admission=None, sendfile=True,
                 connection_class=Connection, allowed_peers=None, outbox=None, tls=None):
        if not hasattr(listener, "accept"):
            raise TypeError(f"Server needs a bound, listening socket, not {listener!r}; "
                            "bind it with forkserve.process.sockets first")
        self.socket = listener
        self.application = app
        #: the protocol spoken: protocol.Connection (HTTP/1.1) or uwsgi.UwsgiConnection
        self.connection_class = connection_class
        #: peers served (a proxy.AddressList), None for all: --uwsgi-allow-from
        self.allowed_peers = allowed_peers
        #: a forkserve.http.tls.Listener for a TLS listener (certfile), else None
        self.tls = tls
        self.limits = limits if limits is not None else Limits()
        self.access_log = access_log
        #: the access log's line format (access_log_format), and, with an
        #: access log, what logs a request: a function of AccessFormat.line's
        #: arguments with `started` (the time.perf_counter() reading when the
        #: request's head began) for `seconds` and no `now` (default: the
        #: line, to access_log at INFO)
        self.access_format = access_format if access_format is not None else AccessFormat()
        # (an access_sink without an access_log: statsd's, forkserve.statsd)
        self.access_sink = access_sink if access_sink is not None else (
            None if access_log is None else self._log_access)
        #: what a proxy in front may say (forwarded_allow_ips, PROXY protocol)
        self.proxy = proxy if proxy is not None else ProxyPolicy()
        #: send wsgi.file_wrapper's regular files with os.sendfile() (the sendfile
        #: setting; never over TLS, which sendfile cannot encrypt)
        self.sendfile = sendfile and tls is None
        #: the process's transport.Outbox, which writes whole responses at the
        #: end of the loop's pass (batch_responses), or None
        self.outbox = outbox
        self.logger = error_log if error_log is not None else logging.getLogger("forkserve.error")
        self.on_request = on_request
        self._hub = get_hub()
        self.loop = self._hub.loop
        self.draining = False
        self.keep_alive_ended = False
        self.active_requests = 0
        # Servers of one worker share `connections`, so --worker-connections
        # caps the worker, not each listening address.
        self.connections = connections if connections is not None \
            else Connections(worker_connections)
        #: what decides when to accept, shared like the connections by one
        #: worker's servers (forkserve.process.balance.Admission); None: always
        self.admission = admission
        self._handlers = set()
        self._shortage = ShortageLog(time.monotonic)
        #: the log of responses the server stopped sending (forkserve.http.cuts)
        self.cuts = CutLog(time.monotonic, self.logger)
        # made by start(): the listener's non-blocking stdlib twin (on a
        # duplicate of its descriptor, closed with it), the io watcher on it,
        # and the timer of a pause
        self._accepting = None
        self._readable = None
        self._pause_timer = None
        self._nodelay = False
        self._family, self._type, self._proto = listener.family, listener.type, listener.proto
        address = listener.getsockname()
        if isinstance(address, tuple):
            name, port = server_name or address[0], str(address[1])
        else:
            name, port = server_name or "localhost", ""
        self.base_env = {
            "GATEWAY_INTERFACE": "CGI/1.1",
            "SERVER_SOFTWARE": f"forkserve/{forkserve.__version__}",
            "SERVER_NAME": name,
            "SERVER_PORT": port,
            # where the application is mounted, as Gunicorn reads it (--env
            # SCRIPT_NAME=/prefix or the environment); see forkserve.http.environ
            "SCRIPT_NAME": os.environ.get("SCRIPT_NAME", ""),
            "wsgi.version": (1, 0),
            "wsgi.url_scheme": "http" if tls is None else "https",
            "wsgi.errors": ErrorStream(self.logger),
            "wsgi.file_wrapper": FileWrapper,
            "wsgi.multithread": True,  # greenlets run requests concurrently
            "wsgi.multiprocess": bool(multiprocess),
            "wsgi.run_once": False,
            "wsgi.input_terminated": True,  # wsgi.input returns b"" at the body's end
        }

    @property
    def open_connections(self):
        return len(self._handlers)

    @property
    def closed(self):
        return self._accepting is None

    #: connections taken in one pass of the loop at most (then the loop's
    #: other watchers run): a burst is served in a few passes, not one
    max_accept = 64
    #: seconds one pass may spend taking and serving new connections before
    #: it lets the loop poll: a client that reconnects as soon as it is
    #: answered keeps the listener readable, and a pass that never ended
    #: would keep the process from its CPU turn (forkserve.process.cpu_turns,
    #: whose TURN this is) and the connections it parked from their reads
    pass_seconds = 0.0005

    def start(self):
        self._nodelay = needs_nodelay(self.socket)
        fileno = os.dup(self.socket.fileno())
        self._accepting = socket.socket(self._family, self._type, self._proto, fileno=fileno)
        self._accepting.setblocking(False)
        self._readable = self.loop.io(fileno, 1)
        self._readable.start(self._accept_pending)

    def _accept_pending(self):
        """From the hub, the listener readable: take what is pending, one
        connection after the other, each served until it first waits."""
        connections, admission = self.connections, self.admission
        # the first look knows a connection waits (the watcher fired); a later one looks
        pending = True
        ends = time.perf_counter() + self.pass_seconds
        for _ in range(self.max_accept):
            if self._accepting is None:  # stopped by a connection just served
                return
            if pending is None and time.perf_counter() >= ends:
                return  # the rest next pass, after the loop polls
            if connections.full():
                self._pause(None)
                return
            if admission is not None and not admission.admit(self._accepting, pending):
                self._pause(admission.tick)
                return
            pending = None
            try:
                fileno, address = self._accepting._accept()
            except BlockingIOError:
                return
            except OSError as ex:
                if ex.errno in _ACCEPT_SKIP:
                    continue
                if ex.errno in _ACCEPT_SHORTAGE:
                    self._short_of(ex)
                    return
                raise
            line = self._shortage.accepted()
            if line is not None:
                self.logger.warning("%s", line)
            try:
                sock = self.connection_socket(fileno)
            except OSError:
                os.close(fileno)  # gone before it could be set up
                continue
            serving = greenlet(self._run, self._hub)
            connections.started(serving)
            if admission is not None:
                admission.opened()
            serving.switch(sock, address)

    def connection_socket(self, fileno):
        """The socket the handler gets for the accepted descriptor `fileno`
        (the seam for a listener that wraps it, e.g. in TLS)."""
        sock = Accepted(self._family, self._type, self._proto, fileno=fileno)
        sock.setblocking(False)
        return sock

    def _run(self, sock, address):
        """A connection's greenlet (child of the hub): serve it, report what
        escaped as gevent reports a greenlet's error, and free its place."""
        try:
            self._serve(sock, address)
        except GreenletExit:
            pass
        except BaseException:
            self._hub.handle_error(getcurrent(), *sys.exc_info())
        finally:
            self.connections.ended(getcurrent())
            if self.admission is not None:
                self.admission.closed()

    def _pause(self, seconds):
        """Stop watching the listener until a connection ends (or `seconds`
        pass); then look again."""
        self._readable.stop()
        self.connections.when_one_ends(self._look_again)
        if seconds is not None and self._pause_timer is None:
            self._pause_timer = self.loop.timer(seconds)
            self._pause_timer.start(self._look_again)

    def _look_again(self):
        """A paused server's look: watch the listener again if it may accept.
        Never switches (it runs in a finishing connection's greenlet or the hub)."""
        if self._pause_timer is not None:
            self._pause_timer.close()
            self._pause_timer = None
        if self._accepting is None:
            return
        if self.connections.full():
            self._pause(None)
        elif self.admission is not None and not self.admission.admit(self._accepting):
            self._pause(self.admission.tick)
        else:
            self._readable.start(self._accept_pending)

    def _short_of(self, ex):
        """accept() found no descriptor or memory: shed the oldest connections
        still sending their heads if descriptors ran out, log, and look again
        once the shed ones closed (the next pass) or after SHORTAGE_PAUSE."""
        shed = self._shed_heads() if ex.errno in DESCRIPTOR_ERRNOS else 0
        line = self._shortage.failed(ex.strerror, shed)
        if line is not None:
            self.logger.error("%s", line)
        self._readable.stop()
        if self._pause_timer is None:
            self._pause_timer = self.loop.timer(0 if shed else SHORTAGE_PAUSE)
            self._pause_timer.start(self._look_again)

    def _shed_heads(self):
        """Close the oldest connections still sending their request head (up to
        SHED_BATCH) to free descriptors; how many were shed."""
        waiting = [(handler.head_started, handler) for handler in self._handlers
                   if handler.head_started is not None and not _unread(handler.socket)]
        shed = oldest_heads(waiting, SHED_BATCH, time.monotonic())
        for handler in shed:
            handler.shed()
        return len(shed)

    def _serve(self, sock, address):
        if self.allowed_peers is not None and address not in self.allowed_peers:
            self.logger.warning("refused a uwsgi connection from %s: not in uwsgi_allow_ips "
                                "(--uwsgi-allow-from)", address[0])
            sock.close()
            return
        if self._nodelay:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError as ex:
                if ex.errno not in _SETSOCKOPT_GONE:
                    raise
        handler = self.handler_class(sock, address, self)
        if self.keep_alive_ended:  # accepted as the server began to drain
            handler.http.drain()
        self._handlers.add(handler)
        try:
            handler.handle()
        finally:
            self._handlers.discard(handler)

    def retire(self):
        """Stop accepting, and close each connection after its next response
        (a request already pipelined behind it is answered first). Another
        worker sharing the listener takes the new connections; with none,
        they wait in the listen queue for the replacement."""
        self.keep_alive_ended = True
        for handler in self._handlers:
            handler.http.drain()
        self.stop_accepting()

    def stop_accepting(self):
        """Stop taking new connections; those already accepted are served.
        Never switches: it may run from a loop callback."""
        if self._readable is not None:
            self._readable.close()
        if self._pause_timer is not None:
            self._pause_timer.close()
            self._pause_timer = None
        if self._accepting is not None:
            self._accepting.close()
            self._accepting = None
        self.socket.close()  # closing twice is harmless

    def _log_access(self, environ, request_line, status, response_headers, sent, started):
        if self.access_log.isEnabledFor(logging.INFO):
            self.access_log.info("%s", self.access_format.line(
                environ, request_line, status, response_headers, sent,
                time.perf_counter() - started))

    def drain(self, timeout):
        """Stop accepting and let every connection end by the handler's drain
        rules; after `timeout` seconds close whatever remains. True if all
        ended in time.
        """
        if getcurrent() in self.connections:
            raise RuntimeError("drain() waits for every connection's greenlet, so it cannot "
                               "run in one (e.g. from on_request); call it from another "
                               "greenlet: gevent.spawn(server.drain, timeout)")
        self.draining = True
        self.retire()
        finished = self.connections.join(timeout)
        if not finished:
            self.close_now()
        return bool(finished)

    def close_now(self):
        """Close the listener and every connection at once; in-flight requests
        are abandoned (their greenlets are killed asynchronously)."""
        self.draining = self.keep_alive_ended = True
        self.stop_accepting()
        for handler in list(self._handlers):
            handler.http.drain()
            handler.abort()
        self.connections.kill()


def _unread(sock):
    """Whether bytes wait in sock that its connection has not read yet: a
    request sent at once but not read by a busy worker, not a client holding
    its connection open with half a head. Never shed those."""
    try:
        return fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0") != b"\0\0\0\0"
    except OSError as exc:
        if exc.errno in (errno.EBADF, errno.ENOTCONN, errno.EINVAL):
            return False  # closed meanwhile: nothing to keep
        raise

