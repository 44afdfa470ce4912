"""Loads fine in the master; every worker fails to boot (its --user is bad only
after fork is not possible to fake, so this app breaks gevent.reinit instead)."""
import os

import gevent

_real_reinit = gevent.reinit
MASTER = os.getpid()


def _reinit(*args, **kwargs):
    if os.getpid() != MASTER:
        raise RuntimeError("worker boot failure (raised on purpose by a test)")
    return _real_reinit(*args, **kwargs)


gevent.reinit = _reinit


def app(environ, start_response):
    start_response("200 OK", [("Content-Length", "2")])
    return [b"ok"]
