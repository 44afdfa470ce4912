"""Serve a WSGI app from one process on an inherited listening socket.

    python benchmarks/harness/serve_fd.py gevent --fd 3 examples.persondb.app:app
    python benchmarks/harness/serve_fd.py waitress --fd 3 benchmarks.apps.hello_app:app

The servers that cannot bind port 0 and report it are handed a socket the
harness bound to 127.0.0.1 port 0 (servers.bind_listener), as file
descriptor ``--fd``, so no port number is ever handed around. Each runs
with its own defaults except where noted, no access log, until SIGTERM:

- gevent: ``gevent.pywsgi.WSGIServer`` after ``monkey.patch_all()``: the
  "no fork at all" baseline (the PersonDB team's final fix, BACKGROUND.md);
- waitress: ``create_server(app, sockets=[sock])``, its default 4 threads;
- cheroot: ``cheroot.wsgi.Server``, which takes a socket only through
  systemd socket activation (fd 3 + LISTEN_PID), so the socket is moved to
  fd 3 and LISTEN_PID set to our pid; 10 threads (its default);
- bjoern: ``bjoern.server_run(sock, app)``, one thread, its own libev loop.
"""

import sys

if __name__ == "__main__" and sys.argv[1:2] == ["gevent"]:
    # gevent must patch before anything else imports socket or threading.
    from gevent import monkey
    monkey.patch_all()

import argparse  # noqa: E402  (after patch_all, as gevent requires)
import importlib  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402


def load_app(spec):
    module_name, _, attr = spec.partition(":")
    return getattr(importlib.import_module(module_name), attr or "application")


def serve_gevent(sock, app, backlog):
    import gevent
    from gevent.pywsgi import WSGIServer
    sock.listen(backlog)
    server = WSGIServer(sock, app, log=None)
    gevent.signal_handler(signal.SIGTERM, server.stop, 5)
    gevent.signal_handler(signal.SIGINT, server.stop, 1)
    server.serve_forever()


def serve_waitress(sock, app, backlog):
    from waitress.server import create_server
    server = create_server(app, sockets=[sock])
    signal.signal(signal.SIGTERM, lambda *_: server.close() or sys.exit(0))
    server.run()


def serve_cheroot(sock, app, backlog):
    from cheroot.wsgi import Server
    if sock.fileno() != 3:
        os.dup2(sock.fileno(), 3)
        sock.close()
    os.environ["LISTEN_PID"] = str(os.getpid())
    server = Server(("127.0.0.1", 0), app)
    signal.signal(signal.SIGTERM, lambda *_: server.stop())
    server.start()


def serve_bjoern(sock, app, backlog):
    import bjoern
    # bjoern's C loop returns on SIGTERM/SIGINT by itself.
    bjoern.server_run(sock, app)


SERVERS = {"gevent": serve_gevent, "waitress": serve_waitress, "cheroot": serve_cheroot,
           "bjoern": serve_bjoern}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("server", choices=sorted(SERVERS))
    p.add_argument("--fd", type=int, required=True, help="inherited listening socket")
    p.add_argument("--backlog", type=int, default=2048)
    p.add_argument("app", help="MODULE:ATTRIBUTE")
    args = p.parse_args(argv)
    sock = socket.socket(fileno=args.fd)
    SERVERS[args.server](sock, load_app(args.app), args.backlog)
    return 0


if __name__ == "__main__":
    sys.exit(main())
