"""Start a server, wait until it serves, stop it: one way for every scenario.

A server is started in its own process group (procs.Group), its output in a
fresh log file that starts with the command line. It is ready once it
answers GET ``probe_path`` with 200 and ``processes`` of its processes exist
(the master and every worker of a pre-fork server). Its port is either the
one of the socket the harness bound and passed down (``listener``), or the
one forkserve logs (``Listening at: http://127.0.0.1:PORT``): no server is
ever given a port number found free beforehand.

    with start(argv, log_path=..., processes=5) as server:
        ... server.port, server.url, server.members() ...

A server that exits while starting, or is not ready within ``timeout``,
raises ServerFailed with the end of its log; it is stopped first.
"""

import http.client
import os
import shlex
import ssl
import time

from benchmarks.harness.procs import Group
from forkserve.memory.procfs import listening_addresses
from benchmarks.harness.servers import REPO, bind_listener, port_from_log

__all__ = ["Server", "ServerFailed", "all_cpus", "http_status", "log_tail", "start", "start_spec"]

#: Seconds between two looks at a starting server.
POLL_S = 0.05


class ServerFailed(Exception):
    """A server did not start, or died while under test. The message says how."""


class Server:
    """A started server: its process group, port and log."""

    def __init__(self, group, port, log_path, tls=False):
        self.group, self.port, self.log_path = group, port, log_path
        self.tls = tls

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.stop()

    @property
    def pid(self):
        return self.group.pid

    @property
    def url(self):
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    def alive(self):
        return self.group.alive()

    def members(self):
        return self.group.members()

    def log(self):
        with open(self.log_path, "rb") as f:
            return f.read()

    def stats_port(self):
        """The port of forkserve's --stats endpoint, or None."""
        return port_from_log(self.log(), stats=True)

    def stop(self, grace=20.0):
        """SIGTERM the group, SIGKILL what remains after ``grace`` s; the seconds it took."""
        return self.group.stop(grace=grace)


def http_status(port, path="/health", timeout=2.0, tls=False):
    """GET path on 127.0.0.1:port (over TLS, any certificate accepted, with
    `tls`); the status, or None if it did not answer."""
    if tls:
        context = ssl.create_default_context()
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=timeout, context=context)
    else:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path)
        return conn.getresponse().status
    except (OSError, http.client.HTTPException):
        return None
    finally:
        conn.close()


def log_tail(path, lines=12):
    try:
        with open(path, "rb") as f:
            text = f.read()[-8000:].decode("utf-8", "replace")
    except FileNotFoundError:
        return ""
    return "\n".join(text.strip().splitlines()[-lines:])


def start(argv, *, log_path, env=None, cwd=REPO, cpus=None, listener=None, processes=1,
          probe_path="/health", timeout=60.0, port_from_proc=False, tls=False):
    """Start ``argv`` (pinned to ``cpus`` with taskset, if given) and wait until
    it serves; a Server. ``listener``, a socket the harness bound, is passed
    down (the command names its fd) and closed here once the server has it.
    With ``port_from_proc``, the port is the one the server's processes
    listen on (for a server told port 0 that does not log the port it got).
    """
    argv = (["taskset", "-c", cpus] if cpus else []) + list(argv)
    with open(log_path, "wb") as log:  # fresh: a port from an earlier run must not be read
        log.write(f"$ {shlex.join(argv)}\n".encode())
    try:
        group = Group(argv, log_path=log_path, env=env, cwd=cwd,
                      pass_fds=(listener.fileno(),) if listener else ())
    finally:
        if listener:
            port = listener.getsockname()[1]
            listener.close()  # the server holds its own copy now
    server = Server(group, port if listener else None, log_path, tls)
    try:
        _wait_until_ready(server, processes, probe_path, timeout, port_from_proc)
    except BaseException:
        server.stop(grace=5)
        raise
    return server


def start_spec(spec, *, python, workers, log_path, env=None, cwd=REPO, cpus=None,
               probe_path="/health", timeout=60.0):
    """Start a servers.ServerSpec with ``workers`` workers; a Server once all of
    its processes exist and it answers."""
    listener = bind_listener() if spec.needs_fd else None
    try:
        argv = spec.command(python, workers, listener.fileno() if listener else None)
    except BaseException:
        if listener:
            listener.close()
        raise
    return start(argv, log_path=log_path, env=env, cwd=cwd, cpus=cpus, listener=listener,
                 processes=1 if spec.single else 1 + workers, probe_path=probe_path,
                 timeout=timeout, port_from_proc=spec.port_from_proc, tls=spec.tls)


def listening_port(pids):
    """The one TCP port on 127.0.0.1 that any of ``pids`` listens on, or None."""
    for pid in pids:
        for address in listening_addresses(pid):
            host, _, port = str(address).rpartition(":")
            if host == "127.0.0.1" and port.isdigit() and int(port):
                return int(port)
    return None


def _wait_until_ready(server, processes, probe_path, timeout, port_from_proc=False):
    deadline = time.monotonic() + timeout
    status = None
    while time.monotonic() < deadline:
        if not server.alive():
            raise ServerFailed(f"exited with status {server.group.popen.returncode} while "
                               "starting:\n" + log_tail(server.log_path))
        if server.port is None:
            server.port = (listening_port(server.members()) if port_from_proc
                           else port_from_log(server.log()))
        if server.port is not None and len(server.members()) >= processes:
            status = http_status(server.port, probe_path, tls=server.tls)
            if status == 200:
                return
        time.sleep(POLL_S)
    answered = (f"; GET {probe_path} last answered {status}, not 200: probe a path that "
                "answers 200" if status is not None else "")
    raise ServerFailed(f"not ready within {timeout:.0f}s{answered}:\n"
                       + log_tail(server.log_path))


def all_cpus():
    """A taskset list of every CPU: a server "unpinned" must not inherit the
    client CPUs a scenario pinned itself to (children inherit affinity)."""
    return f"0-{os.cpu_count() - 1}"
