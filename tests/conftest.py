"""Shared fixtures: run the real `python -m forkserve` and talk to it.

Every server starts in its own process group on 127.0.0.1 port 0; the test
learns the port from the server's "Listening at:" log line, polls until a
deadline instead of sleeping, and kills the whole group in teardown.
"""

import pathlib

import pytest
import setproctitle

from forkserve_testing import ServerProcess

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
