"""Serve a WSGI app with waitress, cheroot or bjoern on an inherited socket.

    python benchmarks/fd_servers.py waitress --fd 3 benchmarks.hello_app:app

The hello-world benchmark (benchmarks/hello.py) binds 127.0.0.1 port 0 and
passes the listening socket as file descriptor ``--fd``, so no port number
is ever handed around. Each server runs with its own defaults except where
noted, no access log, until SIGTERM:

- waitress: ``create_server(app, sockets=[sock])``, its default 4 threads;
- cheroot: ``cheroot.wsgi.Server``, which takes a socket only through
  systemd socket activation (fd 3 + LISTEN_PID), so the socket is moved to
  fd 3 and LISTEN_PID set to our pid; 10 threads (its default);
- bjoern: ``bjoern.server_run(sock, app)``, one thread, its own libev loop.
"""

import argparse
import importlib
import os
import signal
import socket
import sys


def load_app(spec):
    module_name, _, attr = spec.partition(":")
    return getattr(importlib.import_module(module_name), attr or "application")


def serve_waitress(sock, app):
    from waitress.server import create_server
    server = create_server(app, sockets=[sock])
    signal.signal(signal.SIGTERM, lambda *_: server.close() or sys.exit(0))
    server.run()


def serve_cheroot(sock, app):
    from cheroot.wsgi import Server
    if sock.fileno() != 3:
        os.dup2(sock.fileno(), 3)
        sock.close()
    os.environ["LISTEN_PID"] = str(os.getpid())
    server = Server(("127.0.0.1", 0), app)
    signal.signal(signal.SIGTERM, lambda *_: server.stop())
    server.start()


def serve_bjoern(sock, app):
    import bjoern
    # bjoern's C loop returns on SIGTERM/SIGINT by itself.
    bjoern.server_run(sock, app)


SERVERS = {"waitress": serve_waitress, "cheroot": serve_cheroot, "bjoern": serve_bjoern}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("server", choices=sorted(SERVERS))
    p.add_argument("--fd", type=int, required=True, help="inherited listening socket")
    p.add_argument("app", help="MODULE:ATTRIBUTE")
    args = p.parse_args(argv)
    sock = socket.socket(fileno=args.fd)
    SERVERS[args.server](sock, load_app(args.app))
    return 0


if __name__ == "__main__":
    sys.exit(main())
