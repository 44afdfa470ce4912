"""The gevent WSGI server each worker (or single-process mode) runs.

A thin WSGIServer subclass: it serves on a listener it is given (never binds),
caps concurrent connections with a gevent Pool, fills the WSGI environ without
DNS lookups, sets TCP_NODELAY on accepted connections when the platform won't
have done it, and knows how to drain (graceful) or close (fast). The HTTP work
happens per connection in forkserve.http.Handler.
"""

import errno
import logging
import socket
import sys
import time

from gevent import getcurrent
from gevent.pool import Pool
from gevent.pywsgi import WSGIServer, format_date_time

import forkserve
from forkserve.http.accesslog import AccessFormat
from forkserve.http.handler import Handler, Limits
from forkserve.http.proxy import ProxyPolicy

__all__ = ["Server"]

# setsockopt on a just-accepted socket fails with these when the client is
# already gone; nothing to do about it, the handler will see EOF.
_SETSOCKOPT_GONE = frozenset({errno.EINVAL, errno.ECONNRESET, errno.ENOTCONN, errno.EBADF})


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


class Server(WSGIServer):
    """Serve `app` on an already bound and listening gevent socket.

    `on_request()` runs after every response to a request the application saw
    (it must not block; to stop the server from it, spawn a greenlet that
    calls drain()). `access_log`, if a Logger, gets one combined-format line
    per such request; `error_log` gets refusals (INFO, one line), framing
    warnings and application tracebacks (ERROR) and is wsgi.errors.
    """

    handler_class = Handler
    #: the access log's line format (make_servers sets access_log_format's)
    access_format = AccessFormat()
    #: what a proxy in front may say (make_servers sets it from the settings)
    proxy = ProxyPolicy()

    def access_write(self, line):
        """Write one access log line (make_servers puts logs.access_writer() here)."""
        self.access_log.info("%s", line)
    base_env = {
        "GATEWAY_INTERFACE": "CGI/1.1",
        "SERVER_SOFTWARE": f"forkserve/{forkserve.__version__}",
        "SCRIPT_NAME": "",
        "wsgi.version": (1, 0),
        "wsgi.multithread": True,  # greenlets run requests concurrently
        "wsgi.multiprocess": False,
        "wsgi.run_once": False,
        "wsgi.input_terminated": True,  # wsgi.input returns b"" at the body's end
    }

    def __init__(self, listener, app, *, worker_connections=1000, limits=None,
                 access_log=None, error_log=None, multiprocess=True,
                 on_request=None, server_name=None, pool=None):
        if not hasattr(listener, "accept"):
            raise TypeError(f"Server needs a bound, listening socket, not {listener!r}; "
                            "bind it with forkserve.process.sockets first")
        self.limits = limits if limits is not None else Limits()
        self.access_log = access_log
        self.logger = error_log if error_log is not None else logging.getLogger("forkserve.error")
        self.on_request = on_request
        self.server_name = server_name
        self.draining = False
        self.active_requests = 0
        self._handlers = set()
        self._nodelay = False
        self._date = (0, b"")
        # Servers of one worker share `pool`, so --worker-connections caps the
        # worker, not each listening address.
        pool = pool if pool is not None else Pool(worker_connections)
        super().__init__(listener, app, spawn=pool, log=None,
                         error_log=self.logger, environ={"wsgi.multiprocess": bool(multiprocess)})

    @property
    def open_connections(self):
        return len(self._handlers)

    def init_socket(self):
        super().init_socket()
        # A listener shared by forked workers must not block: another worker
        # may take the connection between our readiness event and accept().
        self.socket.setblocking(False)
        self._nodelay = needs_nodelay(self.socket)

    def update_environ(self):
        # gevent's version calls socket.getfqdn(): a DNS lookup per start.
        address = self.address
        if isinstance(address, tuple):
            self.environ["SERVER_NAME"] = self.server_name or address[0]
            self.environ["SERVER_PORT"] = str(address[1])
        else:
            self.environ["SERVER_NAME"] = self.server_name or "localhost"
            self.environ["SERVER_PORT"] = ""

    def handle(self, sock, address):
        if self._nodelay:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError as ex:
                if ex.errno not in _SETSOCKOPT_GONE:
                    raise
        handler = self.handler_class(sock, address, self)
        self._handlers.add(handler)
        try:
            handler.handle()
        finally:
            self._handlers.discard(handler)

    def http_date(self):
        """The Date header value, formatted at most once a second."""
        now = int(time.time())
        if now != self._date[0]:
            self._date = (now, format_date_time(now))
        return self._date[1]

    def drain(self, timeout):
        """Stop accepting, close idle connections now, let in-flight requests
        finish (each connection closes after its response), and after
        `timeout` seconds close whatever remains. True if all finished in time.
        """
        if getcurrent() in self.pool:
            raise RuntimeError("drain() waits for every connection's greenlet, so it cannot "
                               "run in one (e.g. from on_request); call it from another "
                               "greenlet: gevent.spawn(server.drain, timeout)")
        self.draining = True
        if not self.closed:
            self.close()
        for handler in list(self._handlers):
            handler.close_if_idle()
        finished = self.pool.join(timeout=timeout)
        if not finished:
            self.close_now()
        return bool(finished)

    def close_now(self):
        """Close the listener and every connection at once; in-flight requests
        are abandoned (their greenlets are killed asynchronously)."""
        self.draining = True
        if not self.closed:
            self.close()
        for handler in list(self._handlers):
            handler.abort()
        self.pool.kill(block=False)
