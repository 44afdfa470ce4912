"""The server registry: every server the scenarios compare, and how to start it.

Two line-ups, one ServerSpec each: `persondb_servers()` runs
examples.persondb.app:app (benchmarks/run.py), preloaded once
in its master, with the same worker count, no access log, and its processes
pinned to the same CPUs; `hello_servers()` runs benchmarks/apps/hello_app.py on
every WSGI server that installs here (benchmarks/hello.py). Each ServerSpec
says how to build its command line, whether it can run here (and if not,
why), and how the harness learns its port:

- forkserve binds 127.0.0.1 port 0 itself and logs the port it got;
- Gunicorn, uWSGI and the gevent baseline are handed a listening socket that
  the harness bound to 127.0.0.1 port 0 (Gunicorn's ``fd://N``, uWSGI's
  systemd socket activation, ``--fd`` for serve_fd.py's gevent, waitress,
  cheroot and bjoern). No server is ever
  given a port number found free beforehand: another process could take it
  in between.

Every listening socket the harness creates has TCP_NODELAY, as Gunicorn and
forkserve set on theirs. gevent's pywsgi writes a response's headers and
body in two send() calls; without TCP_NODELAY the body waits for the
client's delayed ACK and every keep-alive request takes ~40 ms.
"""

import dataclasses
import http.client
import os
import re
import socket
import subprocess
import sys
import tempfile

__all__ = ["APP", "HELLO_APP", "ServerSpec", "bind_listener", "hello_servers",
           "keepalive_problem", "persondb_servers", "port_from_log", "python_version",
           "throughput_servers", "tls_files", "uwsgi_fallback"]

#: benchmarks/, where the scenarios are (their apps and Lua scripts in apps/)
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO = os.path.dirname(HERE)
APP = "examples.persondb.app:app"
HELLO_APP = "benchmarks.apps.hello_app:app"
SERVE_FD = os.path.join(HERE, "harness", "serve_fd.py")

_LISTENING = re.compile(rb"Listening at: https?://127\.0\.0\.1:(\d+)")
_STATS = re.compile(rb"Stats at: http://127\.0\.0\.1:(\d+)")


@dataclasses.dataclass(frozen=True)
class ServerSpec:
    """One server configuration in the comparison."""

    name: str
    description: str
    #: PERSONDB_MODE for the app.
    mode: str
    #: Builds argv from (python, workers, listener fd or None).
    command: object
    #: Python statements (imports) that must succeed in the server's Python.
    requires: tuple
    #: True for servers that never fork (one process serves everything).
    single: bool = False
    #: True when the harness binds the socket and passes its fd.
    needs_fd: bool = True
    min_python: tuple = (3, 11)
    #: Extra reason shown in the report (e.g. uWSGI's loop choice).
    note: str = ""
    #: True for servers that bind port 0 themselves but do not log the port
    #: they got (Granian): the harness reads it from /proc (the socket the
    #: server's processes listen on).
    port_from_proc: bool = False
    #: True for a server that serves TLS (the harness probes it and wrk loads it over https)
    tls: bool = False

    def skip_reason(self, python, version):
        """Why this server cannot run with ``python`` here, or None."""
        if version < self.min_python:
            return self._too_old(version)
        for statement in self.requires:
            problem = _import_problem(python, statement)
            if problem:
                return f"'{statement}' fails in {python}: {problem}"
        return None

    def _too_old(self, version):
        have = ".".join(map(str, version))
        need = ".".join(map(str, self.min_python))
        run_it = (f"; to measure it, pass --python with a Python {need}+ that has forkserve "
                  f"installed (python{need} -m venv .venv{need.replace('.', '')} && "
                  f".venv{need.replace('.', '')}/bin/pip install -e '.[bench]', then --python "
                  f".venv{need.replace('.', '')}/bin/python)")
        if self.mode == "share":
            return (f"Python {have}: forkserve.share() needs {need}+ to make objects immortal "
                    "(PEP 683); on older Pythons it only gc.freeze()s, which keeps reference-count "
                    "writes copying pages, so it would measure like forkserve-dict" + run_it)
        return f"needs Python {need}+, have {have}" + run_it

    def port_from_log(self, log_bytes):
        return port_from_log(log_bytes)

    def stats_port_from_log(self, log_bytes):
        return port_from_log(log_bytes, stats=True)


def port_from_log(log_bytes, stats=False):
    """The port forkserve logged it listens on (with ``stats``, its stats
    endpoint's), or None if it has not yet."""
    match = (_STATS if stats else _LISTENING).search(log_bytes)
    return int(match.group(1)) if match else None


def bind_listener(backlog=2048):
    """A listening TCP socket on 127.0.0.1, port chosen by the kernel."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind(("127.0.0.1", 0))
        sock.listen(backlog)
        sock.set_inheritable(True)
    except OSError:
        sock.close()
        raise
    return sock


def _import_problem(python, statement):
    proc = subprocess.run(
        [python, "-c", statement], cwd=REPO, capture_output=True, text=True,
        env=dict(os.environ, PYTHONPATH=REPO), timeout=60,
    )
    if proc.returncode == 0:
        return None
    lines = proc.stderr.strip().splitlines()
    return lines[-1] if lines else f"exit status {proc.returncode}"


def _forkserve(workers_override=None, app=APP, stats=True, extra=()):
    def command(python, workers, fd):
        w = workers if workers_override is None else workers_override
        # The app writes nothing per request; no --access-logfile means none.
        # --stats gives per-worker request counts (read once, after the load).
        argv = [python, "-m", "forkserve", "-w", str(w), "-b", "127.0.0.1:0", *extra]
        return argv + (["--stats", "127.0.0.1:0"] if stats else []) + [app]
    return command


def _gunicorn(config=None, app=APP, preload=True):
    def command(python, workers, fd):
        argv = [python, "-m", "gunicorn"] + (["--preload"] if preload else [])
        argv += ["-k", "gevent", "-w", str(workers), "-b", f"fd://{fd}",
                 # Gunicorn reads ./gunicorn.conf.py by default; name the file
                 # (or an empty one) so the cwd cannot change the config.
                 "-c", config or os.devnull]
        if preload:
            # Same conditions as the others: no worker heartbeat kills
            # while a worker copies a gigabyte of pages.
            argv += ["--timeout", "120", "--graceful-timeout", "10"]
        return argv + ["--keep-alive", "5", "--worker-connections", "1000", app]
    return command


def _uwsgi(app, protocol, extra=()):
    def command(python, workers, fd):
        # uWSGI takes the socket through systemd socket activation: LISTEN_FDS
        # sockets start at fd 3, and LISTEN_PID must be uWSGI's own pid, which
        # `sh -c 'LISTEN_PID=$$ exec ...'` provides (exec keeps the pid).
        script = 'LISTEN_PID=$$ LISTEN_FDS=1 exec "$@"' + ("" if fd == 3 else f" 3<&{fd}")
        return ["sh", "-c", script, "sh", python, "-c", "import pyuwsgi; pyuwsgi.run()",
                "--master", "--processes", str(workers), "--gevent", "1000",
                "--protocol", protocol, "--module", app, "--need-app",
                "--single-interpreter", "--die-on-term", "--disable-logging", *extra]
    return command


def _granian(app, workers_override=None):
    def command(python, workers, fd):
        # Granian binds the address itself (no fd hand-over) and logs the
        # port it was given, so port 0 is read back from /proc.
        w = workers if workers_override is None else workers_override
        return [python, "-m", "granian", "--interface", "wsgi", "--workers", str(w),
                "--host", "127.0.0.1", "--port", "0", "--no-access-log", app]
    return command


#: where the TLS scenarios' self-signed certificate is made (tls_files)
TLS_DIR = os.path.join(tempfile.gettempdir(), "forkserve-bench-tls")


def tls_files(directory=None):
    """(certificate, key) for 127.0.0.1 in `directory` (TLS_DIR), made once with
    the openssl CLI: a self-signed RSA 2048 certificate, the same files for
    every server."""
    directory = directory or TLS_DIR
    cert, key = os.path.join(directory, "cert.pem"), os.path.join(directory, "key.pem")
    if not (os.path.exists(cert) and os.path.exists(key)):
        os.makedirs(directory, exist_ok=True)
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days",
                        "30", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                        "-keyout", key, "-out", cert], check=True, capture_output=True)
    return cert, key


def _with_tls(command, flags):
    """`command` with the TLS files given by `flags(cert, key)`, before its app argument."""
    def with_files(python, workers, fd):
        argv = command(python, workers, fd)
        return argv[:-1] + flags(*tls_files()) + argv[-1:]
    return with_files


#: Python statements that find the uwsgi executable beside the servers' Python and check
#: it serves https (pyuwsgi's wheels are built without OpenSSL: no --https-socket)
_UWSGI_HTTPS = (
    "import os, subprocess, sys; exe = os.path.join(os.path.dirname(sys.executable), 'uwsgi');"
    " ok = os.path.exists(exe) and b'--https-socket' in subprocess.run("
    "[exe, '--help'], capture_output=True).stdout;"
    " ok or sys.exit('no uwsgi with --https-socket beside this Python: pip install uwsgi "
    "(it builds with OpenSSL where its headers are installed)')",)


def _uwsgi_https(app):
    def command(python, workers, fd):
        cert, key = tls_files()
        # the uwsgi executable, not pyuwsgi (no OpenSSL in its wheels); it binds
        # the address itself, and its port is read back from /proc
        return [os.path.join(os.path.dirname(python), "uwsgi"), "--master", "--processes",
                str(workers), "--gevent", "1000", "--https-socket",
                f"127.0.0.1:0,{cert},{key}", "--module", app, "--need-app",
                "--single-interpreter", "--die-on-term", "--disable-logging"]
    return command


def _serve_fd(server, app):
    def command(python, workers, fd):
        return [python, SERVE_FD, server, "--fd", str(fd), app]
    return command


def persondb_servers():
    """Every PersonDB configuration, in the order of the report. Ratios use 'gunicorn'."""
    return [
        ServerSpec(
            "gunicorn", "Gunicorn --preload -k gevent", "dict", _gunicorn(),
            requires=("import gunicorn", "import gevent"),
        ),
        ServerSpec(
            "gunicorn-gc", "Gunicorn --preload -k gevent + gc recipe in hooks", "dict",
            _gunicorn(os.path.join(HERE, "apps", "gunicorn.conf.py")),
            requires=("import gunicorn", "import gevent"),
        ),
        ServerSpec(
            "uwsgi", "uWSGI (pyuwsgi) master + processes, gevent loop", "dict",
            _uwsgi(APP, "http", ("--buffer-size", "16384")),
            requires=("import pyuwsgi", "import gevent"),
            note=("gevent loop (--gevent 1000), app loaded in the master (no lazy-apps). "
                  "One request per connection: with gevent 26, pyuwsgi 2.0.30's gevent loop "
                  "fails every HTTP/1.1 keep-alive request (--protocol http11: AttributeError: "
                  "'gevent.libev.corecext.io' object has no attribute 'stop'), so it runs "
                  "--protocol http and wrk reconnects for each request."),
        ),
        ServerSpec(
            "gevent-single", "gevent WSGIServer, one process", "dict", _serve_fd("gevent", APP),
            requires=("import gevent",), single=True,
        ),
        ServerSpec(
            "forkserve-dict", "forkserve, plain dicts", "dict", _forkserve(),
            requires=("import forkserve.cli",), needs_fd=False,
        ),
        ServerSpec(
            "forkserve-share", "forkserve, dicts + forkserve.share()", "share", _forkserve(),
            # The public names, whichever module implements them.
            requires=("import forkserve.cli", "from forkserve import share, SharingWarning"),
            needs_fd=False, min_python=(3, 12),
        ),
        ServerSpec(
            "forkserve-store", "forkserve, forkserve.store.Store", "store", _forkserve(),
            requires=("import forkserve.cli", "from forkserve.store import Store"), needs_fd=False,
        ),
        ServerSpec(
            "forkserve-single", "forkserve -w 0 (one process), plain dicts", "dict",
            _forkserve(0), requires=("import forkserve.cli",), single=True, needs_fd=False,
        ),
    ]


#: The name earlier scenarios know persondb_servers by.
all_servers = persondb_servers


UWSGI_CLOSE_NOTE = (
    "uWSGI's keep-alive mode (--protocol http11 with its gevent loop) failed the probe here "
    "({problem}), so it runs --protocol http: one request per connection, a new TCP "
    "connection per request, which wrk counts as 'closed by server'.")


def hello_servers():
    """Every hello-world configuration, in the order of the report."""
    gevent = ("import gevent",)
    return [
        ServerSpec("forkserve-w0", "forkserve -w 0 (one process)", "",
                   _forkserve(0, HELLO_APP, stats=False),
                   requires=("import forkserve.cli",), single=True, needs_fd=False),
        ServerSpec("forkserve-w4", "forkserve -w 4", "", _forkserve(4, HELLO_APP, stats=False),
                   requires=("import forkserve.cli",), needs_fd=False),
        ServerSpec("gevent-pywsgi", "gevent.pywsgi.WSGIServer, one process, TCP_NODELAY",
                   "", _serve_fd("gevent", HELLO_APP), requires=gevent, single=True),
        ServerSpec("gunicorn", "gunicorn -k gevent -w 4", "",
                   _gunicorn(app=HELLO_APP, preload=False),
                   requires=("import gunicorn",) + gevent),
        ServerSpec("uwsgi", "uWSGI (pyuwsgi) --master --processes 4 --gevent 1000, keep-alive "
                   "(--protocol http11)", "", _uwsgi(HELLO_APP, "http11"),
                   requires=("import pyuwsgi",) + gevent),
        ServerSpec("waitress", "waitress, one process, 4 threads (its default)", "",
                   _serve_fd("waitress", HELLO_APP), requires=("import waitress",),
                   single=True),
        ServerSpec("cheroot", "cheroot (CherryPy's server), one process, 10 threads", "",
                   _serve_fd("cheroot", HELLO_APP), requires=("import cheroot",), single=True),
        ServerSpec("bjoern", "bjoern (C, libev), one process", "",
                   _serve_fd("bjoern", HELLO_APP), requires=("import bjoern",), single=True,
                   note="`pip install bjoern` builds only with libev's headers "
                        "(apt-get install libev-dev)"),
        ServerSpec("meinheld", "meinheld (C, greenlet)", "", None,
                   requires=("import meinheld",), single=True,
                   note="`pip install meinheld` fails here: meinheld 1.0.2 (2020, its last "
                        "release) pins greenlet<0.5, which does not build on Python 3.11+"),
    ]


def throughput_servers():
    """benchmarks/throughput.py's line-up: {scenario: [(spec, workers)]}, in the
    order of its table; ratios are to the Granian row of the same worker count."""
    granian = ("import granian",)
    forkserve = ("import forkserve.cli",)
    uwsgi_note = ("closes every connection: it runs --protocol http (pyuwsgi's gevent loop "
                  "fails HTTP/1.1 keep-alive here), so wrk reconnects for every request and "
                  "counts each close as a read error")
    gunicorn = ServerSpec("gunicorn", "Gunicorn --preload -k gevent", "dict", _gunicorn(),
                          requires=("import gunicorn", "import gevent"))
    uwsgi = ServerSpec("uwsgi", "uWSGI (pyuwsgi) --processes 4 --gevent 1000", "dict",
                       _uwsgi(APP, "http", ("--buffer-size", "16384")),
                       requires=("import pyuwsgi", "import gevent"))
    granian_4 = ServerSpec("granian", "Granian --interface wsgi (each worker loads its own copy)",
                           "dict", _granian(APP), requires=granian, needs_fd=False,
                           port_from_proc=True)
    forkserve_4 = ServerSpec("forkserve", "forkserve, plain dicts (heap shared on 3.12+)", "dict",
                             _forkserve(stats=False), requires=forkserve, needs_fd=False)
    hello = [
        (ServerSpec("granian-w1", "Granian --interface wsgi --workers 1", "",
                    _granian(HELLO_APP, 1), requires=granian, needs_fd=False,
                    port_from_proc=True), 1),
        (ServerSpec("granian-w4", "Granian --interface wsgi --workers 4", "",
                    _granian(HELLO_APP, 4), requires=granian, needs_fd=False,
                    port_from_proc=True), 4),
        (ServerSpec("forkserve-w0", "forkserve -w 0 (one process)", "",
                    _forkserve(0, HELLO_APP, stats=False), requires=forkserve, single=True,
                    needs_fd=False), 0),
        (ServerSpec("forkserve-w4", "forkserve -w 4", "",
                    _forkserve(4, HELLO_APP, stats=False), requires=forkserve,
                    needs_fd=False), 4),
    ]
    return {
        "persondb": [
            (gunicorn, 4),
            (dataclasses.replace(uwsgi, note=uwsgi_note), 4),
            (granian_4, 4),
            (forkserve_4, 4),
            (ServerSpec("forkserve-noyield", "forkserve, plain dicts, --no-yield-cpu (workers "
                        "sharing the CPU by scheduler ticks)", "dict",
                        _forkserve(stats=False, extra=("--no-yield-cpu",)), requires=forkserve,
                        needs_fd=False), 4),
            (ServerSpec("forkserve-geventlocal", "forkserve, plain dicts, --no-c-local "
                        "(Bottle's request and response in gevent's greenlet-locals)", "dict",
                        _forkserve(stats=False, extra=("--no-c-local",)), requires=forkserve,
                        needs_fd=False), 4),
            (ServerSpec("forkserve-store", "forkserve, PERSONDB_MODE=store", "store",
                        _forkserve(stats=False),
                        requires=forkserve + ("from forkserve.store import Store",),
                        needs_fd=False), 4),
            (ServerSpec("forkserve-w0", "forkserve -w 0 (one process), plain dicts", "dict",
                        _forkserve(0, stats=False), requires=forkserve, single=True,
                        needs_fd=False), 0),
        ],
        "hello": hello,
        # a connection per request (wrk sends Connection: close), as behind
        # nginx's default proxy_pass or uwsgi_pass
        "persondb-close": [(gunicorn, 4), (uwsgi, 4), (granian_4, 4), (forkserve_4, 4)],
        "hello-close": hello[:2] + [
            (ServerSpec("uwsgi", "uWSGI (pyuwsgi) --processes 4 --gevent 1000", "",
                        _uwsgi(HELLO_APP, "http"), requires=("import pyuwsgi", "import gevent")),
             4),
            (ServerSpec("gunicorn", "Gunicorn -k gevent -w 4", "",
                        _gunicorn(app=HELLO_APP, preload=False),
                        requires=("import gunicorn", "import gevent")), 4),
        ] + hello[2:],
        # the same servers twice: keep-alive, and a new connection (a full
        # handshake) for every request
        "tls-keepalive": tls_servers(),
        "tls-close": tls_servers(),
    }


def tls_servers():
    """The TLS scenarios' line-up: hello world over https, 2 workers each, on
    the same certificate (tls_files); ratios are to Gunicorn's row."""
    forkserve = ("import forkserve.cli",)
    return [
        (ServerSpec("gunicorn", "Gunicorn -k gevent -w 2 --certfile --keyfile", "",
                    _with_tls(_gunicorn(app=HELLO_APP, preload=False),
                              lambda cert, key: ["--certfile", cert, "--keyfile", key]),
                    requires=("import gunicorn", "import gevent"), tls=True), 2),
        (ServerSpec("uwsgi", "uWSGI --processes 2 --gevent 1000 --https-socket", "",
                    _uwsgi_https(HELLO_APP), requires=_UWSGI_HTTPS + ("import gevent",),
                    needs_fd=False, port_from_proc=True, tls=True,
                    note="closes the connection after every response on its https-socket "
                         "(wrk counts each close as a read error), so both TLS scenarios "
                         "make a handshake per request"), 2),
        (ServerSpec("granian", "Granian --interface wsgi --workers 2 --ssl-certificate", "",
                    _with_tls(_granian(HELLO_APP),
                              lambda cert, key: ["--ssl-certificate", cert, "--ssl-keyfile", key]),
                    requires=("import granian",), needs_fd=False, port_from_proc=True,
                    tls=True), 2),
        (ServerSpec("forkserve", "forkserve -w 2 --certfile --keyfile", "",
                    _with_tls(_forkserve(2, HELLO_APP, stats=False),
                              lambda cert, key: ["--certfile", cert, "--keyfile", key]),
                    requires=forkserve, needs_fd=False, tls=True), 2),
    ]


def uwsgi_fallback(problem):
    """uWSGI on the hello app without keep-alive, when keepalive_problem found one."""
    return ServerSpec("uwsgi", "uWSGI (pyuwsgi) --master --processes 4 --gevent 1000, "
                      "one request per connection (--protocol http)", "",
                      _uwsgi(HELLO_APP, "http"), requires=("import pyuwsgi",),
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


def python_version(python):
    if python == sys.executable:
        return sys.version_info[:2]
    out = subprocess.run([python, "-c", "import sys; print(*sys.version_info[:2])"],
                         capture_output=True, text=True, check=True, timeout=60).stdout
    return tuple(int(part) for part in out.split())
