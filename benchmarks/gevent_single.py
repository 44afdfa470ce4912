"""Serve a WSGI app from one process with gevent's own WSGIServer.

    python benchmarks/gevent_single.py --fd 3 examples.persondb.app:app

The "no fork at all" baseline: the PersonDB team's final fix (see
BACKGROUND.md). It serves on a listening socket inherited as file
descriptor ``--fd`` (the harness binds 127.0.0.1 port 0 and passes it), so
there is no port to race for. No access log, like every benchmarked server.
"""

from gevent import monkey

monkey.patch_all()

import argparse  # noqa: E402  (after patch_all, as gevent requires)
import importlib  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import sys  # noqa: E402

import gevent  # noqa: E402
from gevent.pywsgi import WSGIServer  # noqa: E402


def load_app(spec):
    module_name, _, attr = spec.partition(":")
    module = importlib.import_module(module_name)
    return getattr(module, attr or "application")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--fd", type=int, required=True, help="inherited listening socket")
    p.add_argument("--backlog", type=int, default=2048)
    p.add_argument("app", help="MODULE:ATTRIBUTE")
    args = p.parse_args(argv)

    listener = socket.socket(fileno=args.fd)
    listener.listen(args.backlog)
    server = WSGIServer(listener, load_app(args.app), log=None)
    gevent.signal_handler(signal.SIGTERM, server.stop, 5)
    gevent.signal_handler(signal.SIGINT, server.stop, 1)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
