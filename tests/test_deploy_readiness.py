"""What a readiness probe sees while forkserve starts (examples/deploy/kubernetes).

forkserve binds its addresses, then loads the application (and its data),
then listens and forks the workers. So while the data loads, a probe's
connection is refused, and an HTTP answer can only come from a worker,
once the data is loaded: no probe can call the instance ready too early.
"""

import socket

import pytest

from conftest import APPS
from deploy_cluster import UnixHTTPConnection
from forkserve_testing import ServerProcess, poll

pytestmark = pytest.mark.e2e


def _health(path):
    connection = UnixHTTPConnection(str(path), timeout=5)
    try:
        connection.request("GET", "/health")
        return connection.getresponse().status
    finally:
        connection.close()


def test_probes_are_refused_while_the_data_loads_and_answered_once_workers_serve(tmp_path):
    gate = tmp_path / "loaded"
    address = tmp_path / "app.sock"
    server = ServerProcess(["-w", "2"], app="gated:app", env={"GATE": str(gate)}, cwd=APPS,
                           log_dir=tmp_path, bind=f"unix:{address}")
    try:
        poll(lambda: "gated: loading until" in server.log(), 30, message="the app to load")
        assert address.exists()  # bound before loading, so a taken address fails fast
        with socket.socket(socket.AF_UNIX) as probe, pytest.raises(ConnectionRefusedError):
            probe.connect(str(address))
        gate.touch()
        poll(lambda: _answers(address), 30, message="/health once the workers serve")
    finally:
        server.kill_group()


def _answers(address):
    try:
        return _health(address) == 200
    except ConnectionRefusedError:
        return False
