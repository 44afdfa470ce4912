"""Shared fixtures: run the real `python -m forkserve` and talk to it.

Every server starts in its own process group on 127.0.0.1 port 0; the test
learns the port from the server's "Listening at:" log line, polls until a
deadline instead of sleeping, and kills the whole group in teardown.
"""

import faulthandler
import os
import pathlib
import socket

import pytest
import setproctitle

from forkserve.process import threads
from forkserve_testing import ServerProcess, poll

ROOT = pathlib.Path(__file__).resolve().parent.parent
APPS = pathlib.Path(__file__).resolve().parent / "apps"


@pytest.fixture(autouse=True)
def _process_title_restored():
    """Unit tests that build a Master or a worker in this process set its
    title ("forkserve: master ..."); put it back, so that `forkserve memory`
    never takes the test runner for a server."""
    title = setproctitle.getproctitle()
    yield
    setproctitle.setproctitle(title)


@pytest.fixture
def single_threaded():
    """For a test that forks this process itself, as a master forks a worker:
    the process must then be single-threaded, as the master must be (a child
    inherits only the forking thread; Python 3.12+ warns, and 3.15's warning
    is an error here). The only thread pytest adds is faulthandler's watchdog,
    armed for every test by `faulthandler_timeout` (pyproject.toml): it is
    stopped for this test, which `timeout` (pytest-timeout's SIGALRM, no
    thread) still bounds. Any other thread left alive fails the test here."""
    faulthandler.cancel_dump_traceback_later()
    poll(lambda: threads.count() == 1, timeout=5,
         message=f"this process to be single-threaded (threads: {threads.python_threads()})")


@pytest.fixture
def run_server(tmp_path):
    started = []

    def start(*args, app="basic:app", env=None, wait=True, cwd=None, timeout=30,
              python_flags=()):
        server = ServerProcess(args, app=app, env=env, cwd=cwd or APPS, log_dir=tmp_path,
                               python_flags=python_flags)
        started.append(server)
        if wait:
            server.wait_listening(timeout=timeout)
        return server

    yield start
    for server in started:
        server.kill_group()


def _forbidden(what):
    def forbidden(*args, **kwargs):
        raise AssertionError(f"a test that must not {what} did: drive it with an injected fake")
    return forbidden


@pytest.fixture
def no_fork(monkeypatch):
    """os.fork and os.kill fail the test: for the pure decisions and the loops
    that drive them, which take fork, kill and waitpid as arguments. Use it
    as `pytestmark = pytest.mark.usefixtures("no_fork")`."""
    monkeypatch.setattr(os, "fork", _forbidden("fork"))
    monkeypatch.setattr(os, "kill", _forbidden("send a signal"))


@pytest.fixture
def no_sockets(monkeypatch):
    """Creating a socket fails the test: for protocol and balance logic that
    takes bytes or a fake select and gives events or decisions."""
    monkeypatch.setattr(socket, "socket", _forbidden("create a socket"))
    monkeypatch.setattr(socket, "create_connection", _forbidden("create a socket"))


@pytest.fixture(params=["c", "python"])
def head_path(request, monkeypatch):
    """Run the test twice: with the C fast path of the HTTP heads
    (forkserve/http/_h1.c) and with the Python code alone, which must give
    the same answers. The C one fails where the extension did not build,
    unless FORKSERVE_NO_C asks for Python only."""
    from forkserve.http import protocol
    if request.param == "python":
        monkeypatch.setattr(protocol.Connection, "_fast_parse", None)
        monkeypatch.setattr(protocol.Connection, "_fast_build", None)
    elif protocol.Connection._fast_parse is None:
        if os.environ.get("FORKSERVE_NO_C"):
            pytest.skip("FORKSERVE_NO_C is set: the Python code only")
        pytest.fail("forkserve.http._h1 is not built: pip install -e . with a C compiler")
    return request.param
