"""uWSGI itself (pyuwsgi) and forkserve run the same ini file
(tests/apps/uwsgi_compare.ini) side by side behind one real nginx with
uwsgi_pass; the same requests go to both and their answers are compared:
status, the headers nginx passes on, and what the application saw.

Skipped when pyuwsgi is not installed (`pip install pyuwsgi`) or nginx is
missing."""

import hashlib
import importlib.util
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile

import pytest

from deploy_cluster import Nginx, require_nginx, uwsgi_params
from forkserve_testing import poll

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

APPS = pathlib.Path(__file__).resolve().parent / "apps"
INI = APPS / "uwsgi_compare.ini"
#: environ values that differ between the two servers, and why
EXPECTED_DIFFERENCES = {
    # uWSGI passes nginx's empty CONTENT_LENGTH on; forkserve leaves the key
    # out when there is no body, as its HTTP side does
    "CONTENT_LENGTH": ("", None),
    # uWSGI leaves SCRIPT_NAME out when nginx sends none; forkserve has ""
    # (its setting's, as on its HTTP side); PEP 3333 allows both
    "SCRIPT_NAME": (None, ""),
}


def _start(command, run_dir, log_path):
    log = open(log_path, "wb")
    environment = {**os.environ, "RUNTIME_DIRECTORY": str(run_dir), "PYTHONUNBUFFERED": "1"}
    environment.pop("FORKSERVE_WORKERS", None)
    return subprocess.Popen(command, cwd=run_dir, env=environment, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True), log


@pytest.fixture(scope="module")
def both():
    """nginx with /uwsgi/ -> uWSGI and /forkserve/ -> forkserve, on one ini file."""
    require_nginx(pytest)
    if importlib.util.find_spec("pyuwsgi") is None:
        pytest.skip("pyuwsgi is not installed; `pip install pyuwsgi` to compare with uWSGI")
    directory = pathlib.Path(tempfile.mkdtemp(prefix="forkserve-vs-uwsgi-"))
    directory.chmod(0o755)  # nginx's workers run as nobody
    shutil.copy(uwsgi_params(), directory / "uwsgi_params")
    servers = {}
    nginx = None
    try:
        for name, command in (
                ("uwsgi", [os.path.join(os.path.dirname(sys.executable), "uwsgi"),
                           "--ini", str(INI)]),
                ("forkserve", [sys.executable, "-m", "forkserve", "--ini", str(INI)])):
            run_dir = directory / name
            run_dir.mkdir(mode=0o755)
            servers[name] = (*_start(command, run_dir, directory / f"{name}.log"), run_dir)
        for name, (proc, _, run_dir) in servers.items():
            def ready():
                if proc.poll() is not None:
                    raise AssertionError(f"{name} exited with {proc.returncode}:\n"
                                         + (directory / f"{name}.log").read_text())
                log = (directory / f"{name}.log").read_text(errors="replace")
                return (run_dir / "app.sock").exists() and (
                    "spawned uWSGI worker 2" in log or "Booting worker 2 " in log)
            poll(ready, 60, message=f"{name} to serve")

        def site(listen):
            return ("server {\n  client_max_body_size 20m;\n"
                    + "".join(f"  listen {address};\n" for address in listen)
                    + "  location = / { return 404; }\n"
                    + "".join(f"  location /{name}/ {{ include {directory}/uwsgi_params; "
                              f"uwsgi_pass unix:{directory / name / 'app.sock'}; }}\n"
                              for name in servers)
                    + "}\n")
        nginx = Nginx(directory, site).start()
        yield nginx
    finally:
        if nginx is not None:
            nginx.stop()
        for proc, log, _ in servers.values():
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(10)
            log.close()
        shutil.rmtree(directory, ignore_errors=True)


def ask(nginx, server, method, path, body=None, headers=None, chunked=False):
    connection = nginx.connection()
    try:
        connection.request(method, f"/{server}{path}", body=body, headers=headers or {},
                           encode_chunked=chunked)
        response = connection.getresponse()
        data = response.read()
        kept = {name: value for name, value in response.getheaders()
                if name.lower() in ("content-type", "content-length", "transfer-encoding")}
        return response.status, kept, data
    finally:
        connection.close()


REQUESTS = [
    ("GET", "/env/a/b?x=1&y=%20z", None, {"Cookie": "s=1; t=2", "X-Tag": "one",
                                          "User-Agent": "compare/1"}, False),
    ("GET", "/env/caf%C3%A9/%7Euser", None, {}, False),
    ("POST", "/env/form", b"name=value&" * 5000,
     {"Content-Type": "application/x-www-form-urlencoded"}, False),
    ("POST", "/env/chunked", [b"a" * 3000, b"b" * 90000],
     {"Content-Type": "application/octet-stream"}, True),
    ("PUT", "/env/empty", b"", {}, False),
    ("GET", "/big?300001", None, {}, False),
    ("GET", "/big-length?300001", None, {}, False),
    ("HEAD", "/big-length?5000", None, {}, False),
]


@pytest.mark.parametrize("method, path, body, headers, chunked", REQUESTS,
                         ids=[f"{r[0]} {r[1]}" for r in REQUESTS])
def test_forkserve_answers_as_uwsgi_does_on_the_same_ini(both, method, path, body, headers,
                                                         chunked):
    answers = {}
    for server in ("uwsgi", "forkserve"):
        sent = iter(body) if chunked else body
        answers[server] = ask(both, server, method, path, sent, headers, chunked)
    (status, kept, data), (fs_status, fs_kept, fs_data) = answers["uwsgi"], answers["forkserve"]
    assert fs_status == status
    assert fs_kept.get("Content-Type") == kept.get("Content-Type")
    if not path.startswith("/env/") or method == "HEAD":
        assert hashlib.sha1(fs_data).hexdigest() == hashlib.sha1(data).hexdigest()
        # framing: the same length where uWSGI sent one; where it sent none (so nginx
        # chunks), forkserve may know it (the application returned a list)
        assert fs_kept.get("Content-Length") == kept.get("Content-Length") or (
            "Content-Length" not in kept and fs_kept["Content-Length"] == str(len(fs_data)))
        return
    seen = {server: json.loads(answer[2].decode().replace(f"/{server}/", "/PREFIX/"))
            for server, answer in answers.items()}
    for environ in seen.values():
        environ.pop("pid")
    for key, (uwsgi_value, forkserve_value) in EXPECTED_DIFFERENCES.items():
        if seen["uwsgi"].get(key) == uwsgi_value and seen["forkserve"].get(key) == \
                forkserve_value:
            seen["uwsgi"][key] = seen["forkserve"][key]
    assert seen["forkserve"] == seen["uwsgi"]
