"""benchmarks/uwsgi_nginx.py: its nginx site, its --max-requests run (what a recycle
costs: backends, ini, ratios), and --quick runs for real
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
    rows = _quick_run(tmp_path, "--connections", "8", timeout=150)
    paths = {"fs-uwsgi", "fs-proxy", "fs-proxy-default"} | ({"uwsgi"} if shutil.which(
        "uwsgi", path=str(pathlib.Path(sys.executable).parent)) else set())
    assert {row["path"] for row in rows} == paths
    assert all(row["rate"] > 0 and row["errors"] == 0 for row in rows), rows


def test_a_recycle_run_gives_both_uwsgi_pass_backends_one_ini_with_max_requests(tmp_path):
    found = uwsgi_nginx.recycle_backends(tmp_path, 3, 1000)
    assert found["fs-http"][-5:] == ["--chdir", str(uwsgi_nginx.APP_DIR), "-b", "127.0.0.1:0",
                                     "hello_app:app"]
    assert ["--max-requests", "1000"] == found["gunicorn"][7:9] and "gevent" in found["gunicorn"]
    ini = pathlib.Path(found["fs-ini"][-1]).read_text()
    assert "processes = 3\n" in ini and "max-requests = 1000\n" in ini
    assert f"socket = {tmp_path}/fs-ini.sock\n" in ini
    if "uwsgi-ini" in found:  # pyuwsgi installed: the same settings, its own socket
        other = pathlib.Path(found["uwsgi-ini"][-1]).read_text()
        assert other == ini.replace("fs-ini.sock", "uwsgi-ini.sock")


def test_a_recycle_run_reports_each_path_as_ratios_to_max_requests_0():
    from benchmarks.harness.wrk import PhaseResult

    def result(rate, p99, slowest):
        return PhaseResult(responses=rate * 10, duration_s=10.0, ok=rate * 10, not_found=0,
                           bad_status=0, connect_errors=0, read_errors=0, write_errors=0,
                           timeouts=0, p50_us=p99 // 2, p90_us=p99, p99_us=p99, p999_us=p99,
                           max_us=slowest)
    rows = uwsgi_nginx.recycle_rows({("fs-http", 0): [result(1000, 2000, 50_000)] * 3,
                                     ("fs-http", 1000): [result(900, 3000, 80_000),
                                                         result(800, 3000, 120_000),
                                                         result(850, 2500, 60_000)]})
    recycled = next(row for row in rows if row["max_requests"] == 1000)
    assert recycled["rate_x"] == 0.85 and recycled["p99_x"] == 1.5
    assert recycled["max_us"] == 120_000 and recycled["max_x"] == 2.4  # the slowest round's


@pytest.mark.e2e
@pytest.mark.timeout(240)
def test_a_quick_recycle_run_recycles_and_loses_no_request(tmp_path):
    rows = _quick_run(tmp_path, "--max-requests", "200", "--workers", "2", "--connections", "8",
                      timeout=210)
    assert {(row["path"], row["max_requests"]) for row in rows} >= {
        (path, n) for path in ("fs-http", "gunicorn", "fs-ini") for n in (0, 200)}
    assert all(row["rate"] > 0 and row["errors"] == 0 for row in rows), rows
    assert "is recycled" in (tmp_path / "fs-http-200.log").read_text()


def _quick_run(tmp_path, *options, timeout):
    """Run `uwsgi_nginx.py --quick *options` as a user would; its result's rows."""
    require_nginx(pytest)
    if not shutil.which("wrk"):
        pytest.skip("wrk is not installed (apt-get install wrk)")
    result = subprocess.run([sys.executable, "benchmarks/uwsgi_nginx.py", "--quick", *options,
                             "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                            timeout=timeout)
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads((tmp_path / "result.json").read_text())["rows"]
