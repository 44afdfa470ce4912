"""tests/apps/django_shop/uwsgi.ini, a uWSGI deployment's ini file, started
unchanged: `forkserve --ini uwsgi.ini` behind a real nginx with uwsgi_pass to
its unix socket; the admin login (a POST with CSRF and cookies) through nginx;
touch-reload; TERM with die-on-term; and --check-config on a broken ini."""

import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import tempfile

import pytest

from deploy_cluster import Nginx, require_nginx, uwsgi_params
from forkserve_testing import poll

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

APPS = pathlib.Path(__file__).resolve().parent / "apps"
INI = APPS / "django_shop" / "uwsgi.ini"
sys.path.insert(0, str(APPS))
from django_shop import client as django_client  # noqa: E402


class IniServer:
    """python -m forkserve --ini INI, in its own process group, logging to a file."""

    def __init__(self, args, env, directory):
        self.log_path = directory / "forkserve.log"
        self.log_file = open(self.log_path, "wb")
        environment = {**os.environ, "PYTHONUNBUFFERED": "1", **env}
        environment.pop("FORKSERVE_WORKERS", None)
        self.proc = subprocess.Popen([sys.executable, "-m", "forkserve", *args], cwd=directory,
                                     env=environment, stdout=self.log_file,
                                     stderr=subprocess.STDOUT, start_new_session=True)

    def log(self):
        return self.log_path.read_text(errors="replace")

    def wait_for(self, pattern, timeout=60):
        def seen():
            found = re.search(pattern, self.log())
            if found is None and self.proc.poll() is not None:
                raise AssertionError(f"forkserve exited with {self.proc.returncode}:\n"
                                     f"{self.log()}")
            return found
        return poll(seen, timeout, message=pattern)

    def stop(self):
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(10)
        self.log_file.close()


@pytest.fixture
def deployment(tmp_path):
    """(nginx, server, run_dir): the shop started from its uwsgi.ini, nginx in front."""
    require_nginx(pytest)
    # nginx's workers run as nobody: the socket and nginx's files live in a 0755 directory
    run_dir = pathlib.Path(tempfile.mkdtemp(prefix="forkserve-shop-"))
    run_dir.chmod(0o755)
    shutil.copy(uwsgi_params(), run_dir / "uwsgi_params")
    server = IniServer(["--ini", str(INI)], {"RUNTIME_DIRECTORY": str(run_dir),
                                             "DJANGO_SHOP_DB": str(tmp_path / "shop.db")},
                       tmp_path)
    nginx = None
    try:
        server.wait_for(r"Listening at: uwsgi:unix:" + re.escape(str(run_dir)))
        socket_path = run_dir / "django_shop.sock"

        def site(listen):
            return ("server {\n" + "".join(f"  listen {address};\n" for address in listen)
                    + "  location = / { return 404; }\n"
                    f"  location / {{ include {run_dir}/uwsgi_params; "
                    f"uwsgi_pass unix:{socket_path}; }}\n}}\n")
        nginx = Nginx(run_dir, site, tcp=True).start()
        yield nginx, server, run_dir
    finally:
        if nginx is not None:
            nginx.stop()
        server.stop()
        shutil.rmtree(run_dir, ignore_errors=True)


def get(nginx, path, headers=None):
    connection = django_client.http.client.HTTPConnection("127.0.0.1", nginx.port, timeout=30)
    try:
        connection.request("GET", path, headers=headers or {})
        response = connection.getresponse()
        return response.status, response.read().decode("utf-8", "replace")
    finally:
        connection.close()


def test_django_uwsgi_ini_runs_unchanged_behind_nginx_uwsgi_pass(deployment):
    nginx, server, run_dir = deployment
    # the ini's settings in force: two workers, its pid file and stats socket
    server.wait_for(r"Booting worker 2 ")
    log = server.log()
    assert len(re.findall(r"Booting worker \d+", log)) == 2, log
    assert (run_dir / "django_shop.pid").read_text().strip() == str(server.proc.pid)
    assert "Stats at: unix:" + str(run_dir / "stats.sock") in log
    # what forkserve does differently is said once, at start
    assert log.count("reload-on-rss = 1024: forkserve limits private memory, not RSS") == 1
    assert "lazy-apps = true: ignored" in log and "Traceback" not in log
    status, page = get(nginx, "/en/products/")
    assert status == 200 and "Product 1" in page
    status, data = get(nginx, "/api/products.json")
    assert status == 200 and json.loads(data)
    cookies = django_client.login(nginx.port)  # GET the form, POST it with its CSRF token
    status, page = get(nginx, "/admin/shop/product/", headers=cookies)
    assert status == 200 and "Select product to change" in page
    assert os.stat(run_dir / "django_shop.sock").st_mode & 0o777 == 0o666  # chmod-socket


def test_touch_reload_and_term_as_a_uwsgi_user_expects(deployment):
    nginx, server, run_dir = deployment
    before = server.log().count("Booting worker")
    (run_dir / "reload").write_text("now")
    server.wait_for(r"reload\S* changed: reloading")
    poll(lambda: server.log().count("Booting worker") >= before + 2, 90,
         message="the new generation's workers")
    poll(lambda: get(nginx, "/en/")[0] == 200, 60, message="the shop after the reload")
    # die-on-term: TERM stops, gracefully; vacuum: the socket and pid file are gone
    os.kill(server.proc.pid, signal.SIGTERM)
    assert server.proc.wait(60) == 0
    assert not (run_dir / "django_shop.sock").exists()
    assert not (run_dir / "django_shop.pid").exists()


def test_check_config_reports_every_problem_of_an_ini_in_one_run(tmp_path):
    ini = tmp_path / "broken.ini"
    ini.write_text("[uwsgi]\nmodule = basic:app\nsocket = @abstract\nprocesses = four\n"
                   "static-map = /static=/srv/static\nharakiri = %v\nprocesess = 3\n")
    result = subprocess.run([sys.executable, "-m", "forkserve", "-c", str(ini),
                             "--check-config"], capture_output=True, text=True, cwd=APPS,
                            timeout=60)
    assert result.returncode == 2
    for line, what in ((3, "abstract unix sockets"), (4, "expected a whole number"),
                       (5, "static-map is not supported"), (6, "placeholder %v"),
                       (7, "did you mean processes?")):
        assert f"broken.ini line {line}: " in result.stderr and what in result.stderr, \
            result.stderr
    good = tmp_path / "good.ini"
    good.write_text("[uwsgi]\nmodule = basic:app\nhttp-socket = 127.0.0.1:0\nmaster = true\n")
    result = subprocess.run([sys.executable, "-m", "forkserve", "-c", str(good),
                             "--check-config"], capture_output=True, text=True, cwd=APPS,
                            timeout=60)
    assert result.returncode == 0 and "configuration OK" in result.stderr, result.stderr
