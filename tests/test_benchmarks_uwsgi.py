"""benchmarks/uwsgi_nginx.py: its nginx site, and one --quick run for real
(forkserve over uwsgi_pass and proxy_pass with and without upstream
keep-alive, uWSGI over uwsgi_pass behind one
nginx), which must serve every request of every path."""

import json
import pathlib
import shutil
import subprocess
import sys

import pytest

from benchmarks import uwsgi_nginx
from deploy_cluster import require_nginx

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_site_sends_each_path_to_its_backend_the_way_deployments_do():
    text = uwsgi_nginx.site("/d", ["fs-uwsgi", "fs-proxy", "fs-proxy-default", "uwsgi"])(
        ["127.0.0.1:1"])
    assert "location /fs-uwsgi/ { include /d/uwsgi_params; uwsgi_pass unix:/d/fs-uwsgi.sock; }" \
        in text
    assert "location /uwsgi/ { include /d/uwsgi_params; uwsgi_pass unix:/d/uwsgi.sock; }" in text
    assert "proxy_pass http://fs_proxy; proxy_http_version 1.1;" in text
    assert "server unix:/d/fs-proxy.sock; keepalive 32;" in text
    # nginx's default proxying: no proxy_http_version (HTTP/1.0), no upstream keep-alive
    assert "location /fs-proxy-default/ { proxy_pass http://unix:/d/fs-proxy.sock:; }" in text


def test_backends_bind_the_protocol_each_path_speaks(tmp_path):
    found = uwsgi_nginx.backends(tmp_path, 3, ["--no-balance"])
    assert f"uwsgi:unix:{tmp_path}/fs-uwsgi.sock" in found["fs-uwsgi"][0]
    assert f"unix:{tmp_path}/fs-proxy.sock" in found["fs-proxy"][0]
    assert "--no-balance" in found["fs-proxy"][0] and "3" in found["fs-proxy"][0]


@pytest.mark.e2e
@pytest.mark.timeout(180)
def test_a_quick_run_measures_every_path_without_errors(tmp_path):
    require_nginx(pytest)
    if not shutil.which("wrk"):
        pytest.skip("wrk is not installed (apt-get install wrk)")
    result = subprocess.run([sys.executable, "benchmarks/uwsgi_nginx.py", "--quick",
                             "--connections", "8", "--out", str(tmp_path)], cwd=ROOT,
                            capture_output=True, text=True, timeout=150)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = json.loads((tmp_path / "result.json").read_text())["rows"]
    paths = {"fs-uwsgi", "fs-proxy", "fs-proxy-default"} | ({"uwsgi"} if shutil.which(
        "uwsgi", path=str(pathlib.Path(sys.executable).parent)) else set())
    assert {row["path"] for row in rows} == paths
    assert all(row["rate"] > 0 and row["errors"] == 0 for row in rows), rows
