"""What a serving process (a worker, or the single-process server) is built from.

The master imports these modules before it forks (`preload`) so that every
worker shares them, and each worker builds its gevent servers with
`make_servers` after the fork, on duplicates of the inherited listeners.
"""

import os
import time

from forkserve import logs
from forkserve.process.cpu_turns import take_turns

__all__ = ["preload", "make_servers", "outbox_for", "cpu_turns_for", "gevent_socket"]


def preload():
    """Import, in the master, everything a worker needs after fork.

    Modules imported before the fork are shared by every worker (and frozen
    with the rest of the heap); modules imported after it are one private
    copy per worker, and may not even be readable once --user has dropped
    privileges.
    """
    import gevent.event  # noqa: F401
    import gevent.threadpool  # noqa: F401  (the hub's, made in the worker: imports pprint)

    import forkserve.http.accesslog  # noqa: F401
    import forkserve.http.body  # noqa: F401
    import forkserve.http.environ  # noqa: F401
    import forkserve.http.handler  # noqa: F401
    import forkserve.http.responder  # noqa: F401
    import forkserve.http.protocol  # noqa: F401
    import forkserve.http.proxy  # noqa: F401
    import forkserve.http.response  # noqa: F401
    import forkserve.http.server  # noqa: F401
    import forkserve.http.tls  # noqa: F401
    import forkserve.http.transport  # noqa: F401
    import forkserve.http.uwsgi  # noqa: F401
    import forkserve.process.balance  # noqa: F401


def outbox_for(cfg):
    """The process's forkserve.http.transport.Outbox (batch_responses, on
    unless --no-batch-responses), else None. Made after fork, on the process's own hub."""
    if not cfg.batch_responses:
        return None
    from gevent import get_hub

    from forkserve.http.transport import Outbox
    return Outbox(get_hub().loop)


def cpu_turns_for(cfg, outbox):
    """The process's CPU turns (forkserve.process.cpu_turns; yield_cpu, on
    unless --no-yield-cpu), writing what `outbox` holds before each yield,
    else None. Made after fork, on the process's own hub."""
    if not cfg.yield_cpu:
        return None
    from gevent import get_hub

    return take_turns(get_hub().loop, before_yield=outbox and outbox.write_held)


def make_servers(cfg, app, listeners, *, multiprocess, on_request, hooks, admission=None,
                 outbox=None):
    """One gevent WSGI server per listening socket, configured from settings,
    serving the application wrapped in `hooks` (pre_request/post_request);
    `admission` (forkserve.process.balance) decides when they accept; the
    process's `outbox` (outbox_for) writes their whole responses."""
    from forkserve.http.accesslog import AccessFormat
    from forkserve.http.handler import Limits
    from forkserve.http.proxy import AddressList, ProxyPolicy
    from forkserve.http import tls
    from forkserve.http.server import Connections, Server
    from forkserve.http.uwsgi import UwsgiConnection
    from forkserve.process import sockets

    limits = Limits(limit_request_line=cfg.limit_request_line,
                    limit_request_fields=cfg.limit_request_fields,
                    limit_request_field_size=cfg.limit_request_field_size,
                    limit_request_body=cfg.limit_request_body,
                    header_timeout=cfg.header_timeout,
                    keep_alive=cfg.keep_alive,
                    body_timeout=cfg.body_timeout, send_timeout=cfg.send_timeout)
    access = logs.access_log if logs.access_enabled(cfg) else None
    # one cap for the worker, across its listeners
    connections = Connections(cfg.worker_connections)
    proxy = ProxyPolicy(cfg.forwarded_allow_ips, cfg.secure_scheme_headers,
                        cfg.proxy_protocol, cfg.proxy_allow_ips)
    access_format = AccessFormat(cfg.access_log_format)
    app = hooks.wrap_app(app)  # pre_request / post_request
    # certfile: the HTTP listeners serve TLS with the master's context (uwsgi ones stay plain)
    secure = None if tls.context is None else tls.Listener(
        tls.context, logs.error_log, suppress_ragged_eofs=cfg.suppress_ragged_eofs)
    # a uwsgi listener's peer is the trusted proxy: its vars say the client and
    # the scheme (forkserve.http.uwsgi), no header or PROXY line does
    speaks = {"http": dict(proxy=proxy, tls=secure),
              "uwsgi": dict(proxy=ProxyPolicy(secure_scheme_headers={}),
                            connection_class=UwsgiConnection,
                            allowed_peers=AddressList(cfg.uwsgi_allow_ips))}
    protocols = sockets.protocols(cfg.bind, cfg.protocol, len(listeners))
    return [Server(gevent_socket(listener), app, limits=limits, access_log=access,
                   error_log=logs.error_log, multiprocess=multiprocess,
                   on_request=on_request, connections=connections,
                   access_format=access_format,
                   access_sink=_request_sink(access, access_format),
                   admission=admission, sendfile=cfg.sendfile, outbox=outbox,
                   **speaks[protocol])
            for listener, protocol in zip(listeners, protocols)]


def _request_sink(access, access_format):
    """What sees each request: the access log's sink (with an access log) and
    statsd's metrics (with statsd_host), or None."""
    from forkserve import statsd
    sink = logs.access_sink(access_format) if access is not None else None
    if statsd.client is None:
        return sink
    count = statsd.client.request
    clock = time.perf_counter

    def counted(environ, request_line, status, response_headers, sent, started):
        count(status, clock() - started)
        if sink is not None:
            sink(environ, request_line, status, response_headers, sent, started)
    return counted


def gevent_socket(listener):
    """A gevent socket on a duplicate of the inherited listening descriptor."""
    from gevent import socket as gsocket
    return gsocket.socket(listener.family, listener.type, listener.proto,
                          fileno=os.dup(listener.fileno()))
