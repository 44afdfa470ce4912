"""The HTTP server each worker (or single-process mode) runs on the gevent loop.

It serves on a listener it is given (never binds): one accept greenlet takes
connections while the connection pool has room (one cap per worker, shared by
its listeners), sets TCP_NODELAY where the platform won't have, and runs a
forkserve.http.handler.Handler per connection in a greenlet of the pool.
Only gevent's public API is used: its sockets, Pool, spawn and loop timers.

Stopping: drain() stops accepting and lets every connection end on its own
(see the handler's drain rules: the next response says Connection: close, an
idle connection closes after keep_alive) until a timeout, then close_now()
cuts what remains. retire() stops accepting and makes every further response
close its connection, without waiting (--max-requests reached).
"""

import errno
import fcntl
import logging
import os
import socket
import sys
import termios
import time

import gevent
from gevent import getcurrent, get_hub
from gevent.pool import Pool

import forkserve
from forkserve.http.accesslog import AccessFormat
from forkserve.http.cuts import CutLog
from forkserve.http.handler import ErrorStream, FileWrapper, Handler, Limits
from forkserve.http.protocol import Connection
from forkserve.http.proxy import ProxyPolicy
from forkserve.http.shortage import DESCRIPTOR_ERRNOS, SHED_BATCH, ShortageLog, oldest_heads

__all__ = ["Server", "needs_nodelay"]

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
                 on_request=None, server_name=None, pool=None, access_format=None,
                 access_sink=None, proxy=None, admission=None, sendfile=True,
                 connection_class=Connection, allowed_peers=None, outbox=None):
        if not hasattr(listener, "accept"):
            raise TypeError(f"Server needs a bound, listening socket, not {listener!r}; "
                            "bind it with forkserve.process.sockets first")
        self.socket = listener
        self.application = app
        #: the protocol spoken: protocol.Connection (HTTP/1.1) or uwsgi.UwsgiConnection
        self.connection_class = connection_class
        #: peers served (a proxy.AddressList), None for all: --uwsgi-allow-from
        self.allowed_peers = allowed_peers
        self.limits = limits if limits is not None else Limits()
        self.access_log = access_log
        #: the access log's line format (access_log_format), and, with an
        #: access log, what logs a request: a function of AccessFormat.line's
        #: arguments with `started` (the time.perf_counter() reading when the
        #: request's head began) for `seconds` and no `now` (default: the
        #: line, to access_log at INFO)
        self.access_format = access_format if access_format is not None else AccessFormat()
        self.access_sink = None if access_log is None else (
            access_sink if access_sink is not None else self._log_access)
        #: what a proxy in front may say (forwarded_allow_ips, PROXY protocol)
        self.proxy = proxy if proxy is not None else ProxyPolicy()
        #: send wsgi.file_wrapper's regular files with os.sendfile() (the sendfile setting)
        self.sendfile = sendfile
        #: the process's transport.Outbox, which writes whole responses at the
        #: end of the loop's pass (batch_responses), or None
        self.outbox = outbox
        self.logger = error_log if error_log is not None else logging.getLogger("forkserve.error")
        self.on_request = on_request
        self.loop = get_hub().loop
        self.draining = False
        self.keep_alive_ended = False
        self.active_requests = 0
        # Servers of one worker share `pool`, so --worker-connections caps the
        # worker, not each listening address.
        self.pool = pool if pool is not None else Pool(worker_connections)
        #: what decides when to accept, shared like the pool by one worker's
        #: servers (forkserve.process.balance.Admission); None: always
        self.admission = admission
        self._handlers = set()
        self._shortage = ShortageLog(time.monotonic)
        #: the log of responses the server stopped sending (forkserve.http.cuts)
        self.cuts = CutLog(time.monotonic, self.logger)
        self._acceptor = None
        self._nodelay = False
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
            "wsgi.url_scheme": "http",
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
        return self._acceptor is None or self._acceptor.dead

    def start(self):
        self._nodelay = needs_nodelay(self.socket)
        self._acceptor = gevent.spawn(self._accept_loop)

    def _accept_loop(self):
        pool = self.pool
        accept = self.socket.accept
        admission = self.admission
        while True:
            pool.wait_available()
            if admission is not None:
                admission.wait_turn(self.socket)
            try:
                sock, address = accept()
            except OSError as ex:
                if ex.errno in _ACCEPT_SKIP:
                    continue
                if ex.errno in _ACCEPT_SHORTAGE:
                    shed = self._shed_heads() if ex.errno in DESCRIPTOR_ERRNOS else 0
                    line = self._shortage.failed(ex.strerror, shed)
                    if line is not None:
                        self.logger.error("%s", line)
                    # shed ones close as soon as their greenlets run: then accept again
                    gevent.sleep(0 if shed else SHORTAGE_PAUSE)
                    continue
                raise
            line = self._shortage.accepted()
            if line is not None:
                self.logger.warning("%s", line)
            serving = pool.spawn(self._serve, sock, address)
            if admission is not None:
                admission.opened()
                serving.rawlink(admission.closed)  # however the greenlet ends
            # Let the new connection's greenlet run before taking another:
            # accepting back to back would let one worker take a whole burst
            # of connections that the workers sharing the listener could split.
            gevent.sleep(0)

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
        """Stop taking new connections; those already accepted are served."""
        if self._acceptor is not None:
            self._acceptor.kill()
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
        if getcurrent() in self.pool:
            raise RuntimeError("drain() waits for every connection's greenlet, so it cannot "
                               "run in one (e.g. from on_request); call it from another "
                               "greenlet: gevent.spawn(server.drain, timeout)")
        self.draining = True
        self.retire()
        finished = self.pool.join(timeout=timeout)
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
        self.pool.kill(block=False)


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
