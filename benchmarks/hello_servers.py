"""The servers of benchmarks/hello.py: how to start each on the hello app.

Each is a benchmarks.servers.ServerSpec: forkserve binds 127.0.0.1 port 0
itself and logs the port; the others get a listening socket the harness
bound (Gunicorn's fd://N, uWSGI's systemd socket activation, --fd N for the
gevent baseline and for fd_servers.py's waitress, cheroot and bjoern).
uWSGI runs in its keep-alive mode if a probe of two requests on one
connection passes, else (uwsgi_fallback) one request per connection.
"""

import http.client
import os

from benchmarks.servers import HERE, ServerSpec

__all__ = ["APP", "hello_servers", "keepalive_problem", "uwsgi_fallback"]

APP = "benchmarks.hello_app:app"


def _forkserve(workers):
    def command(python, _workers, fd):
        return [python, "-m", "forkserve", "-w", str(workers), "-b", "127.0.0.1:0", APP]
    return command


def _gunicorn(python, workers, fd):
    return [python, "-m", "gunicorn", "-k", "gevent", "-w", str(workers), "-b", f"fd://{fd}",
            "-c", os.devnull, "--keep-alive", "5", "--worker-connections", "1000", APP]


def _uwsgi(protocol):
    def command(python, workers, fd):
        # systemd socket activation, as in servers.py: the socket is fd 3.
        script = 'LISTEN_PID=$$ LISTEN_FDS=1 exec "$@"' + ("" if fd == 3 else f" 3<&{fd}")
        return ["sh", "-c", script, "sh", python, "-c", "import pyuwsgi; pyuwsgi.run()",
                "--master", "--processes", str(workers), "--gevent", "1000",
                "--protocol", protocol, "--module", APP, "--need-app",
                "--single-interpreter", "--die-on-term", "--disable-logging"]
    return command


def _gevent(python, workers, fd):
    return [python, os.path.join(HERE, "gevent_single.py"), "--fd", str(fd), APP]


def _fd_server(name):
    def command(python, workers, fd):
        return [python, os.path.join(HERE, "fd_servers.py"), name, "--fd", str(fd), APP]
    return command


UWSGI_CLOSE_NOTE = (
    "uWSGI's keep-alive mode (--protocol http11 with its gevent loop) failed the probe here "
    "({problem}), so it runs --protocol http: one request per connection, a new TCP "
    "connection per request, which wrk counts as 'closed by server'.")


def hello_servers():
    """Every configuration, in the order of the report."""
    gevent = ("import gevent",)
    return [
        ServerSpec("forkserve-w0", "forkserve -w 0 (one process)", "", _forkserve(0),
                   requires=("import forkserve.cli",), single=True, needs_fd=False),
        ServerSpec("forkserve-w4", "forkserve -w 4", "", _forkserve(4),
                   requires=("import forkserve.cli",), needs_fd=False),
        ServerSpec("gevent-pywsgi", "gevent.pywsgi.WSGIServer, one process, TCP_NODELAY",
                   "", _gevent, requires=gevent, single=True),
        ServerSpec("gunicorn", "gunicorn -k gevent -w 4", "", _gunicorn,
                   requires=("import gunicorn",) + gevent),
        ServerSpec("uwsgi", "uWSGI (pyuwsgi) --master --processes 4 --gevent 1000, keep-alive "
                   "(--protocol http11)", "", _uwsgi("http11"),
                   requires=("import pyuwsgi",) + gevent),
        ServerSpec("waitress", "waitress, one process, 4 threads (its default)", "",
                   _fd_server("waitress"), requires=("import waitress",), single=True),
        ServerSpec("cheroot", "cheroot (CherryPy's server), one process, 10 threads", "",
                   _fd_server("cheroot"), requires=("import cheroot",), single=True),
        ServerSpec("bjoern", "bjoern (C, libev), one process", "", _fd_server("bjoern"),
                   requires=("import bjoern",), single=True,
                   note="`pip install bjoern` builds only with libev's headers "
                        "(apt-get install libev-dev)"),
        ServerSpec("meinheld", "meinheld (C, greenlet)", "", None,
                   requires=("import meinheld",), single=True,
                   note="`pip install meinheld` fails here: meinheld 1.0.2 (2020, its last "
                        "release) pins greenlet<0.5, which does not build on Python 3.11+"),
    ]


def uwsgi_fallback(problem):
    return ServerSpec("uwsgi", "uWSGI (pyuwsgi) --master --processes 4 --gevent 1000, "
                      "one request per connection (--protocol http)", "", _uwsgi("http"),
                      requires=("import pyuwsgi",),
                      note=UWSGI_CLOSE_NOTE.format(problem=problem))


def keepalive_problem(port, timeout=3.0):
    """None if two requests on one connection both get a 200, else what went wrong."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        for n in (1, 2):
            conn.request("GET", "/")
            response = conn.getresponse()
            response.read()
            if response.status != 200 or response.will_close:
                return f"request {n} on one connection: status {response.status}, " \
                       f"will close: {response.will_close}"
        return None
    except (OSError, http.client.HTTPException) as exc:
        return f"request {n} on one connection: {exc!r}"
    finally:
        conn.close()
