"""The servers under test: how to start each one on the same app and data.

Every server runs examples.persondb.app:app, preloaded once in its master,
with the same worker count, no access log, and its processes pinned to the
same CPUs. Each ServerSpec says how to build its command line, whether it
can run here (and if not, why), and how the harness learns its port:

- forkserve binds 127.0.0.1 port 0 itself and logs the port it got;
- Gunicorn, uWSGI and the gevent baseline are handed a listening socket that
  the harness bound to 127.0.0.1 port 0 (Gunicorn's ``fd://N``, uWSGI's
  systemd socket activation, ``--fd`` for the baseline). No server is ever
  given a port number found free beforehand: another process could take it
  in between.

Every listening socket the harness creates has TCP_NODELAY, as Gunicorn and
forkserve set on theirs. gevent's pywsgi writes a response's headers and
body in two send() calls; without TCP_NODELAY the body waits for the
client's delayed ACK and every keep-alive request takes ~40 ms.
"""

import dataclasses
import os
import re
import socket
import subprocess
import sys

__all__ = ["ServerSpec", "all_servers", "bind_listener"]

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
APP = "examples.persondb.app:app"

_LISTENING = re.compile(rb"Listening at: http://127\.0\.0\.1:(\d+)")
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
        if self.mode == "share":
            return (f"Python {have}: forkserve.share() needs {need}+ to make objects immortal "
                    "(PEP 683); on older Pythons it only gc.freeze()s, which keeps reference-count "
                    "writes copying pages, so it would measure like forkserve-dict")
        return f"needs Python {need}+, have {have}"

    def port_from_log(self, log_bytes):
        """The port forkserve reported, or None if it has not yet."""
        match = _LISTENING.search(log_bytes)
        return int(match.group(1)) if match else None

    def stats_port_from_log(self, log_bytes):
        """The port of forkserve's stats endpoint, or None (no --stats, other servers)."""
        match = _STATS.search(log_bytes)
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


def _forkserve(workers_override=None):
    def command(python, workers, fd):
        w = workers if workers_override is None else workers_override
        # The app writes nothing per request; no --access-logfile means none.
        # --stats gives per-worker request counts (read once, after the load).
        return [python, "-m", "forkserve", "-w", str(w), "-b", "127.0.0.1:0",
                "--stats", "127.0.0.1:0", APP]
    return command


def _gunicorn(config=None):
    def command(python, workers, fd):
        argv = [python, "-m", "gunicorn", "--preload", "-k", "gevent",
                "-w", str(workers), "-b", f"fd://{fd}",
                # Gunicorn reads ./gunicorn.conf.py by default; name the file
                # (or an empty one) so the cwd cannot change the config.
                "-c", config or os.devnull,
                # Same conditions as the others: no worker heartbeat kills
                # while a worker copies a gigabyte of pages.
                "--timeout", "120", "--graceful-timeout", "10",
                "--keep-alive", "5", "--worker-connections", "1000"]
        return argv + [APP]
    return command


def _uwsgi(python, workers, fd):
    # uWSGI takes the socket through systemd socket activation: LISTEN_FDS
    # sockets start at fd 3, and LISTEN_PID must be uWSGI's own pid, which
    # `sh -c 'LISTEN_PID=$$ exec ...'` provides (exec keeps the pid).
    script = f'LISTEN_PID=$$ LISTEN_FDS=1 exec "$@" 3<&{fd}'
    if fd == 3:
        script = 'LISTEN_PID=$$ LISTEN_FDS=1 exec "$@"'
    return ["sh", "-c", script, "sh", python, "-c", "import pyuwsgi; pyuwsgi.run()",
            "--master", "--processes", str(workers),
            "--gevent", "1000", "--protocol", "http",
            "--module", APP, "--need-app", "--single-interpreter",
            "--die-on-term", "--disable-logging", "--buffer-size", "16384"]


def _gevent_single(python, workers, fd):
    return [python, os.path.join(HERE, "gevent_single.py"), "--fd", str(fd), APP]


def all_servers():
    """Every configuration, in the order of the report. Ratios use 'gunicorn'."""
    return [
        ServerSpec(
            "gunicorn", "Gunicorn --preload -k gevent", "dict", _gunicorn(),
            requires=("import gunicorn", "import gevent"),
        ),
        ServerSpec(
            "gunicorn-gc", "Gunicorn --preload -k gevent + gc recipe in hooks", "dict",
            _gunicorn(os.path.join(HERE, "gunicorn.conf.py")),
            requires=("import gunicorn", "import gevent"),
        ),
        ServerSpec(
            "uwsgi", "uWSGI (pyuwsgi) master + processes, gevent loop", "dict", _uwsgi,
            requires=("import pyuwsgi", "import gevent"),
            note=("gevent loop (--gevent 1000), app loaded in the master (no lazy-apps). "
                  "One request per connection: with gevent 26, pyuwsgi 2.0.30's gevent loop "
                  "fails every HTTP/1.1 keep-alive request (--protocol http11: AttributeError: "
                  "'gevent.libev.corecext.io' object has no attribute 'stop'), so it runs "
                  "--protocol http and wrk reconnects for each request."),
        ),
        ServerSpec(
            "gevent-single", "gevent WSGIServer, one process", "dict", _gevent_single,
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


def python_version(python):
    if python == sys.executable:
        return sys.version_info[:2]
    out = subprocess.run([python, "-c", "import sys; print(*sys.version_info[:2])"],
                         capture_output=True, text=True, check=True, timeout=60).stdout
    return tuple(int(part) for part in out.split())
