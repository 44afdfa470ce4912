"""End-to-end: real Django, Flask and Falcon apps from real Gunicorn config
files, and forkserve beside the real Gunicorn on the same requests."""

import base64
import glob
import json
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import time

import pytest

from forkserve_testing import LISTENING, ServerProcess, poll

pytestmark = pytest.mark.e2e

COMPAT = os.path.join(os.path.dirname(__file__), "apps", "gunicorn_compat")
HOOKS_CONF = os.path.join(COMPAT, "hooks.conf.py")


class GunicornProcess(ServerProcess):
    """The real Gunicorn, started the way ServerProcess starts forkserve."""

    def __init__(self, args, *, app, log_dir, cwd=COMPAT, env=None):
        self.log_path = os.path.join(log_dir, f"gunicorn-{time.monotonic_ns()}.log")
        environment = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
        self.log_file = open(self.log_path, "w+b")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "-b", "127.0.0.1:0", "-w", "1", *args, app],
            cwd=cwd, env=environment, stdout=self.log_file, stderr=subprocess.STDOUT,
            start_new_session=True)
        self.port = None


@pytest.fixture
def servers(tmp_path):
    """start("forkserve" | "gunicorn", *args, app=...) -> a listening server (one
    worker unless args say otherwise, so access log lines come in request order)."""
    started = []

    def start(kind, *args, app, env=None):
        if kind == "gunicorn":
            server = GunicornProcess(args, app=app, log_dir=tmp_path, env=env)
        else:
            server = ServerProcess(("-w", "1", *args), app=app, env=env, cwd=COMPAT,
                                   log_dir=tmp_path)
        started.append(server)
        server.wait_listening()
        return server

    yield start
    for server in started:
        server.kill_group()


def hook_calls(directory, name):
    calls = []
    for path in sorted(glob.glob(os.path.join(directory, f"{name}.*"))):
        with open(path) as handle:
            calls.extend(json.loads(line) for line in handle)
    return calls


def test_django_site_from_a_gunicorn_config_runs_its_hooks_and_trusts_the_local_proxy(
        servers, tmp_path):
    hook_dir = tmp_path / "hooks"
    hook_dir.mkdir()
    server = servers("forkserve", "-c", HOOKS_CONF, "-w", "2", "--access-logfile",
                     str(tmp_path / "access.log"), app="django_site:application",
                     env={"HOOK_DIR": str(hook_dir)})
    workers = poll(lambda: len(server.children()) == 2 and server.children(),
                   message="2 workers")
    poll(lambda: len(hook_calls(hook_dir, "post_worker_init")) == 2,
         message="post_worker_init in both workers")

    # Behind a proxy on 127.0.0.1 that says https, the SSL-redirecting site serves...
    status, body = server.get("/hello?via=proxy", headers={"X-Forwarded-Proto": "https"})
    assert (status, body) == (200, "hello from django over https\n")
    # ... and without that header it redirects to https, as Django should.
    assert server.get("/hello")[0] == 301

    master = server.pid
    assert hook_calls(hook_dir, "on_starting") == [{"pid": master, "workers": 2}]
    assert hook_calls(hook_dir, "post_freeze") == [{"pid": master}]
    assert hook_calls(hook_dir, "when_ready") == [{"pid": master, "num_workers": 2}]
    assert sorted(call["age"] for call in hook_calls(hook_dir, "pre_fork")) == [1, 2]
    forked = hook_calls(hook_dir, "post_fork")
    assert sorted(call["pid"] for call in forked) == sorted(workers)
    assert {call["ppid"] for call in forked} == {master}
    assert {call["keepalive"] for call in forked} == {5.0}
    assert all(call["booted"] for call in hook_calls(hook_dir, "post_worker_init"))
    assert {(c["method"], c["path"], c["query"]) for c in hook_calls(hook_dir, "pre_request")} \
        == {("GET", "/hello", "via=proxy"), ("GET", "/hello", "")}
    after = poll(lambda: len(hook_calls(hook_dir, "post_request")) == 2 and hook_calls(
        hook_dir, "post_request"), message="post_request for both requests")
    assert sorted((c["status"], c["scheme"]) for c in after) == [(200, "https"), (301, "http")]
    assert {c["sent"] for c in after if c["status"] == 200} == {len(body)}

    server.signal(signal.SIGTTIN)
    poll(lambda: hook_calls(hook_dir, "nworkers_changed"), message="nworkers_changed")
    assert hook_calls(hook_dir, "nworkers_changed") == [{"new": 3, "old": 2}]

    server.signal(signal.SIGTERM)
    assert server.wait_exit() == 0
    exited = {call["pid"] for call in hook_calls(hook_dir, "worker_exit")}
    assert set(workers) <= exited
    assert set(workers) <= {call["pid"] for call in hook_calls(hook_dir, "child_exit")}
    assert hook_calls(hook_dir, "on_exit") == [{"pid": master}]
    assert "when_ready hook: 2 workers" in server.log()
    assert (tmp_path / "access.log").read_text().count('"GET /hello') == 2


@pytest.mark.parametrize("kind", ["forkserve", "gunicorn"])
def test_server_pid_in_worker_hooks_is_the_masters_like_gunicorn(servers, tmp_path, kind):
    server = servers(kind, "-c", HOOKS_CONF, "-w", "2", app="flask_site:app",
                     env={"HOOK_DIR": str(tmp_path)})
    forked = poll(lambda: len(hook_calls(tmp_path, "post_fork")) == 2 and hook_calls(
        tmp_path, "post_fork"), message="post_fork in both workers")
    assert {call["server_pid"] for call in forked} == {server.pid}
    assert server.pid not in {call["pid"] for call in forked}
    if kind == "gunicorn":
        return  # its gevent workers may outlast a TERM by far (issue 22's attacks)
    server.signal(signal.SIGTERM)
    assert server.wait_exit() == 0
    exited = hook_calls(tmp_path, "worker_exit")
    assert {call["server_pid"] for call in exited} == {server.pid} and len(exited) == 2


def test_raw_env_from_a_gunicorn_config_reaches_the_application(servers, tmp_path):
    server = servers("forkserve", "-c", HOOKS_CONF, "-w", "1", app="flask_site:app",
                     env={"HOOK_DIR": str(tmp_path)})
    assert server.get("/environ/SITE_COLOUR") == (200, "teal")


def test_a_raising_post_fork_hook_fails_worker_boot_and_the_server_stops(servers, tmp_path):
    conf = tmp_path / "bad.conf.py"
    conf.write_text("def post_fork(server, worker):\n    raise RuntimeError('no database')\n")
    server = ServerProcess(["-c", str(conf), "-w", "1"], app="flask_site:app", cwd=COMPAT,
                           log_dir=str(tmp_path))
    try:
        assert server.wait_exit() == 3  # WORKER_BOOT_ERROR, as Gunicorn's
        log = server.log()
        assert "RuntimeError: no database" in log and "Traceback" in log
    finally:
        server.kill_group()


def test_a_raising_pre_request_hook_gives_500_like_gunicorn(servers, tmp_path):
    conf = tmp_path / "pre.conf.py"
    conf.write_text("def pre_request(worker, req):\n    raise ValueError('nope')\n")
    for kind in ("forkserve", "gunicorn"):
        server = servers(kind, "-c", str(conf), app="flask_site:app")
        assert server.get("/hello")[0] == 500, kind
        assert "ValueError: nope" in server.log(), kind


# --- the access log, line for line against Gunicorn ---

EVERY_ATOM = ('%(h)s %(l)s %(u)s %(t)s "%(r)s" %(m)s %(U)s %(q)s %(H)s %(s)s %(B)s %(b)s '
              '"%(f)s" "%(a)s" %(T)s %(D)s %(M)s %(L)s %(p)s %({x-made}o)s %({X-Made}o)s '
              '%({user-agent}i)s %({missing}i)s %({wsgi.url_scheme}e)s %({REQUEST_METHOD}e)s '
              '%({nothing}e)s')
#: what differs between two servers on the same request: times and pids
VARIABLE = [(re.compile(r"\[\d\d/\w{3}/\d{4}:\d\d:\d\d:\d\d [+-]\d{4}\]"), "[TIME]"),
            (re.compile(r"<\d+>"), "<PID>")]


def _send_requests(server):
    auth = base64.b64encode(b"alice:secret").decode()
    server.get("/hello?x=1&y=2", headers={"User-Agent": 'agent "quoted"', "Referer": "http://r/"})
    server.request("POST", "/created", body=b"abc", headers={"Authorization": f"Basic {auth}",
                                                              "User-Agent": "poster"})
    server.get("/missing", headers={"User-Agent": "ua"})
    server.request("HEAD", "/hello", headers={"User-Agent": "ua"})


def _lines(path, count):
    def ready():
        try:
            lines = path.read_text().splitlines()
        except FileNotFoundError:
            return None
        return len(lines) >= count and lines
    lines = poll(ready, message=f"{count} access log lines in {path}")
    for pattern, replacement in VARIABLE:
        lines = [pattern.sub(replacement, line) for line in lines]
    return lines


@pytest.mark.parametrize("fmt", [None, EVERY_ATOM], ids=["default", "every-atom"])
def test_access_log_lines_are_gunicorns(servers, tmp_path, fmt):
    found = {}
    for kind in ("gunicorn", "forkserve"):
        log = tmp_path / f"{kind}.access.log"
        args = ["--access-logfile", str(log)] + (["--access-logformat", fmt] if fmt else [])
        server = servers(kind, *args, app="flask_site:app")
        _send_requests(server)
        found[kind] = _lines(log, 4)
    if fmt is not None:  # request times differ: compare their shape, then drop them
        timing = re.compile(r" (\d+) (\d+) (\d+) (\d+\.\d{6}) <PID>")
        for kind, lines in found.items():
            assert all(timing.search(line) for line in lines), (kind, lines)
            found[kind] = [timing.sub(" T D M L <PID>", line) for line in lines]
    assert found["forkserve"] == found["gunicorn"]
    if fmt is None:
        assert found["forkserve"][0] == (
            '127.0.0.1 - - [TIME] "GET /hello?x=1&y=2 HTTP/1.1" 200 17 "http://r/" '
            '"agent \\"quoted\\""')


def test_access_log_is_reopened_on_usr1(servers, tmp_path):
    log = tmp_path / "access.log"
    server = servers("forkserve", "-w", "1", "--access-logfile", str(log), app="flask_site:app")
    server.get("/hello")
    _lines(log, 1)
    os.rename(log, tmp_path / "access.log.1")
    server.signal(signal.SIGUSR1)

    def logged_to_new_file():
        server.get("/hello")
        return log.exists() and log.read_text().count("GET /hello") >= 1
    poll(logged_to_new_file, message="a line in the reopened access log")


@pytest.mark.parametrize("kind", ["forkserve", "gunicorn"])
def test_logconfig_dict_configures_gunicorns_logger_names(servers, tmp_path, kind):
    target = tmp_path / "json-access.log"
    conf = tmp_path / "logging.conf.py"
    settings = {  # laid over Gunicorn's defaults, so it replaces their handlers, as there
        "root": {"level": "INFO", "handlers": []},
        "formatters": {"json": {"format": '{"access": "%(message)s"}'}},
        "handlers": {"file": {"class": "logging.FileHandler", "filename": str(target),
                              "formatter": "json"},
                     "error_console": {"class": "logging.StreamHandler",
                                       "stream": "ext://sys.stderr"}},
        "loggers": {"gunicorn.access": {"handlers": ["file"], "level": "INFO",
                                        "propagate": False},
                    "gunicorn.error": {"handlers": ["error_console"], "level": "INFO"}},
    }
    conf.write_text(f"logconfig_dict = {settings!r}\n")
    server = servers(kind, "-c", str(conf), app="flask_site:app")
    server.get("/hello")
    line = poll(lambda: target.exists() and target.read_text(), message="a JSON access line")
    assert line.startswith('{"access": "127.0.0.1 - - [') and '"GET /hello HTTP/1.1" 200' in line


# --- proxy headers, against Gunicorn ---

@pytest.mark.parametrize("kind", ["forkserve", "gunicorn"])
def test_secure_scheme_headers_are_trusted_only_from_forwarded_allow_ips(servers, kind):
    trusting = servers(kind, app="falcon_site:app")
    assert trusting.get("/scheme", headers={"X-Forwarded-Proto": "https"}) == (200, "https")
    assert trusting.get("/scheme", headers={"X-Forwarded-SSL": "on"}) == (200, "https")
    assert trusting.get("/scheme", headers={"X-Forwarded-Proto": "http"}) == (200, "http")
    assert trusting.get("/scheme") == (200, "http")
    status, _ = trusting.get("/scheme", headers={"X-Forwarded-Proto": "https",
                                                 "X-Forwarded-SSL": "off"})
    assert status == 400  # contradictory
    distrusting = servers(kind, "--forwarded-allow-ips", "10.9.9.9", app="falcon_site:app")
    assert distrusting.get("/scheme", headers={"X-Forwarded-Proto": "https"}) == (200, "http")
    everyone = servers(kind, "--forwarded-allow-ips", "*", app="falcon_site:app")
    assert everyone.get("/scheme", headers={"X-Forwarded-Proto": "https"}) == (200, "https")
    network = servers(kind, "--forwarded-allow-ips", "127.0.0.0/8", app="falcon_site:app")
    assert network.get("/scheme", headers={"X-Forwarded-Proto": "https"}) == (200, "https")


def _raw(port, data):
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(data)
        chunks = []
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
    return b"".join(chunks)


def _v2(client, client_port):
    addresses = socket.inet_aton(client) + socket.inet_aton("127.0.0.1")
    body = addresses + struct.pack(">HH", client_port, 8000)
    return (b"\r\n\r\n\x00\r\nQUIT\n" + bytes([0x21, 0x11]) + struct.pack(">H", len(body))
            + body)


REQUEST = b"GET /remote HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"


@pytest.mark.parametrize("kind", ["forkserve", "gunicorn"])
def test_proxy_protocol_sets_the_client_address(servers, kind):
    server = servers(kind, "--proxy-protocol", "auto", app="flask_site:app")
    v1 = _raw(server.port, b"PROXY TCP4 203.0.113.7 127.0.0.1 51234 8000\r\n" + REQUEST)
    assert v1.startswith(b"HTTP/1.1 200") and v1.endswith(b"203.0.113.7 51234"), v1
    v2 = _raw(server.port, _v2("198.51.100.9", 40001) + REQUEST)
    assert v2.startswith(b"HTTP/1.1 200") and v2.endswith(b"198.51.100.9 40001"), v2
    # the header names the client of every request on its connection: forkserve
    # answers both; Gunicorn's sync worker closes after the first (no keep-alive)
    kept = _raw(server.port, b"PROXY TCP4 203.0.113.8 127.0.0.1 51235 8000\r\n"
                + REQUEST.replace(b"close", b"keep-alive") + REQUEST)
    answers = 2 if kind == "forkserve" else 1
    assert kept.count(b"HTTP/1.1 200") == answers, kept
    assert kept.count(b"203.0.113.8 51235") == answers, kept
    plain = _raw(server.port, REQUEST)
    assert plain.startswith(b"HTTP/1.1 200") and b"127.0.0.1" in plain
    bad = _raw(server.port, b"PROXY TCP4 nonsense\r\n" + REQUEST)
    assert bad.startswith(b"HTTP/1.1 400"), bad


@pytest.mark.parametrize("kind", ["forkserve", "gunicorn"])
def test_proxy_protocol_from_an_untrusted_peer_is_forbidden(servers, kind):
    server = servers(kind, "--proxy-protocol", "v1", "--proxy-allow-from", "10.1.1.1",
                     app="flask_site:app")
    reply = _raw(server.port, b"PROXY TCP4 203.0.113.7 127.0.0.1 51234 8000\r\n" + REQUEST)
    assert reply.startswith(b"HTTP/1.1 403"), reply


def test_check_config_refuses_a_gunicorn_config_with_a_typo(tmp_path):
    conf = tmp_path / "gunicorn.conf.py"
    conf.write_text("workers = 2\nacesslog = '-'\n")
    done = subprocess.run([sys.executable, "-m", "forkserve", "--check-config", "-c", str(conf),
                           "flask_site:app"], cwd=COMPAT, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2
    assert "unknown setting 'acesslog'; did you mean 'accesslog'?" in done.stderr


def test_capture_output_sends_the_apps_prints_to_the_error_log(tmp_path):
    errors = tmp_path / "error.log"
    server = ServerProcess(["-w", "1", "--capture-output", "--error-logfile", str(errors)],
                           app="flask_site:app", cwd=COMPAT, log_dir=str(tmp_path))
    try:
        found = poll(lambda: errors.exists() and LISTENING.search(errors.read_text()),
                     timeout=30, message="the Listening at: line in the error log")
        server.port = int(found.group(1))
        assert server.get("/print") == (200, "ok")
        poll(lambda: "printed by the application" in errors.read_text(),
             message="the print in the error log")
    finally:
        server.kill_group()


def test_pythonpath_finds_the_application_and_umask_sets_the_unix_socket_mode(tmp_path):
    elsewhere = tmp_path / "code"
    elsewhere.mkdir()
    (elsewhere / "far_app.py").write_text(
        "def app(environ, start_response):\n"
        "    start_response('200 OK', [('Content-Type', 'text/plain')])\n"
        "    return [b'far']\n")
    sock_path = tmp_path / "s.sock"
    server = subprocess.Popen(
        [sys.executable, "-m", "forkserve", "-w", "1", "-b", f"unix:{sock_path}",
         "--pythonpath", f"{tmp_path},{elsewhere}", "--umask", "0o077", "far_app:app"],
        cwd=str(tmp_path), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True)
    try:
        poll(sock_path.exists, timeout=30, message="the unix socket")
        assert oct(sock_path.stat().st_mode & 0o777) == oct(0o700)

        def answered():
            with socket.socket(socket.AF_UNIX) as sock:
                try:
                    sock.connect(str(sock_path))
                except ConnectionRefusedError:
                    return None
                sock.sendall(b"GET / HTTP/1.0\r\n\r\n")
                return b"".join(iter(lambda: sock.recv(4096), b""))
        assert poll(answered, message="a response over the unix socket").endswith(b"far")
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait(5)


def test_hup_runs_on_reload_pre_exec_and_pre_retire(servers, tmp_path):
    server = servers("forkserve", "-c", HOOKS_CONF, "-w", "1", app="flask_site:app",
                     env={"HOOK_DIR": str(tmp_path)})
    master = server.pid
    poll(lambda: hook_calls(tmp_path, "post_worker_init"), message="the worker")
    server.signal(signal.SIGHUP)
    poll(lambda: hook_calls(tmp_path, "pre_retire"), timeout=30, message="pre_retire")
    assert hook_calls(tmp_path, "on_reload") == [{"pid": master}]
    assert hook_calls(tmp_path, "pre_exec") == [{"pid": master}]
    assert hook_calls(tmp_path, "pre_retire") == [{"pid": master, "generation": 1}]
    # the new generation ran the config file's hooks too
    assert len(hook_calls(tmp_path, "when_ready")) == 2


def test_a_worker_killed_for_timeout_runs_worker_abort(servers, tmp_path):
    server = servers("forkserve", "-c", HOOKS_CONF, "-w", "1", "--timeout", "1",
                     app="flask_site:app", env={"HOOK_DIR": str(tmp_path)})
    [booted] = poll(lambda: hook_calls(tmp_path, "post_worker_init"), message="the worker")
    try:
        server.get("/block", timeout=3)
    except OSError:
        pass  # the worker dies with the request in flight
    aborted = poll(lambda: hook_calls(tmp_path, "worker_abort"), timeout=20,
                   message="worker_abort")
    assert aborted == [{"pid": booted["pid"]}]
    assert "timed out" in server.log()


@pytest.mark.parametrize("kind", ["forkserve", "gunicorn"])
def test_falcon_behind_a_balancer_from_a_gunicorn_config_file(servers, tmp_path, kind):
    log = tmp_path / "access.log"
    server = servers(kind, "-c", os.path.join(COMPAT, "falcon.conf.py"), "--access-logfile",
                     str(log), app="falcon_site:app")
    assert server.get("/scheme", headers={"X-Scheme": "https", "X-Request-Id": "r-1"}) == \
        (200, "https")
    assert server.get("/scheme", headers={"X-Forwarded-Proto": "https"}) == (200, "http")
    lines = [json.loads(line) for line in _lines(log, 2)]
    assert lines == [
        {"ip": "127.0.0.1", "request": "GET /scheme HTTP/1.1", "status": 200, "id": "r-1",
         "scheme": "https"},
        {"ip": "127.0.0.1", "request": "GET /scheme HTTP/1.1", "status": 200, "id": "-",
         "scheme": "http"}]


@pytest.mark.parametrize("hook, status", [("on_starting(server)", 1), ("when_ready(server)", 1),
                                          ("pre_fork(server, worker)", 1)])
def test_a_raising_master_hook_stops_the_server_with_its_traceback(tmp_path, hook, status):
    name = hook.split("(")[0]
    conf = tmp_path / "raising.conf.py"
    conf.write_text(f"def {hook}:\n    raise RuntimeError('boom in {name}')\n")
    done = subprocess.run([sys.executable, "-m", "forkserve", "-c", str(conf), "-b",
                           "127.0.0.1:0", "-w", "1", "flask_site:app"], cwd=COMPAT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == status
    assert f"Exception in {name} hook:\nTraceback" in done.stderr
    assert f"the {name} hook raised RuntimeError: boom in {name}" in done.stderr
    assert done.stderr.count("Traceback") == 1


def test_a_raising_on_exit_hook_makes_the_exit_status_1_like_gunicorn(servers, tmp_path):
    conf = tmp_path / "exit.conf.py"
    conf.write_text("def on_exit(server):\n    raise RuntimeError('boom on_exit')\n")
    for kind in ("forkserve", "gunicorn"):
        server = servers(kind, "-c", str(conf), app="flask_site:app")
        server.signal(signal.SIGTERM)
        assert server.wait_exit() == 1, kind


@pytest.mark.parametrize("kind", ["forkserve", "gunicorn"])
def test_log_config_file_configures_gunicorns_logger_names(servers, tmp_path, kind):
    target = tmp_path / "ini-access.log"
    ini = tmp_path / "logging.ini"
    ini.write_text(f"""\
[loggers]
keys=root,access,error

[handlers]
keys=file,stderr

[formatters]
keys=tagged

[logger_root]
level=WARNING
handlers=

[logger_access]
level=INFO
handlers=file
propagate=0
qualname=gunicorn.access

[logger_error]
level=INFO
handlers=stderr
propagate=0
qualname=gunicorn.error

[handler_file]
class=FileHandler
formatter=tagged
args=({str(target)!r},)

[handler_stderr]
class=StreamHandler
formatter=tagged
args=(sys.stderr,)

[formatter_tagged]
format=ACCESS %(message)s
""")
    server = servers(kind, "--log-config", str(ini), app="flask_site:app")
    server.get("/hello")
    line = poll(lambda: target.exists() and target.read_text(), message="a line via fileConfig")
    assert line.startswith("ACCESS 127.0.0.1 - - [") and '"GET /hello HTTP/1.1" 200' in line


def test_ctrl_c_runs_worker_int_in_each_worker(servers, tmp_path):
    server = servers("forkserve", "-c", HOOKS_CONF, "-w", "2", app="flask_site:app",
                     env={"HOOK_DIR": str(tmp_path)})
    poll(lambda: len(hook_calls(tmp_path, "post_worker_init")) == 2, message="2 workers")
    workers = {call["pid"] for call in hook_calls(tmp_path, "post_worker_init")}
    server.signal(signal.SIGINT)
    assert server.wait_exit() == 0
    assert {call["pid"] for call in hook_calls(tmp_path, "worker_int")} == workers


def test_request_hooks_get_a_worker_in_single_process_mode(servers, tmp_path):
    server = servers("forkserve", "-c", HOOKS_CONF, "-w", "0", app="flask_site:app",
                     env={"HOOK_DIR": str(tmp_path)})
    assert server.get("/hello")[0] == 200
    done = poll(lambda: hook_calls(tmp_path, "post_request"), message="post_request")
    assert done == [{"path": "/hello", "status": 200, "sent": 17, "scheme": "http", "nr": 1}]
    assert "the post_fork hook never runs with -w 0" in server.log()


def test_check_config_runs_no_hook_and_warns_of_hooks_that_would_never_run(tmp_path):
    def check(*args):
        return subprocess.run([sys.executable, "-m", "forkserve", "--check-config", "-c",
                               HOOKS_CONF, *args, "flask_site:app"], cwd=COMPAT,
                              capture_output=True, text=True, timeout=60,
                              env=dict(os.environ, HOOK_DIR=str(tmp_path)))
    assert check("-w", "2").returncode == 0
    single = check("-w", "0")
    assert single.returncode == 0  # the server would start: a warning, not an error
    assert "the pre_fork hook never runs with -w 0" in single.stderr
    assert "setting(s) with no effect, see above" in single.stderr
    assert os.listdir(tmp_path) == []  # not even on_starting: no server was started


CONTAINER_CONF = """\
bind = "127.0.0.1:0"
workers = 1
worker_class = "gevent"
threads = 4
worker_tmp_dir = "/dev/shm"
preload_app = True
"""


@pytest.mark.parametrize("kind", ["forkserve", "gunicorn"])
def test_the_usual_container_config_starts_and_serves_as_under_gunicorn(servers, tmp_path,
                                                                        kind):
    conf = tmp_path / "gunicorn.conf.py"
    conf.write_text(CONTAINER_CONF)
    server = servers(kind, "-c", str(conf), app="flask_site:app")
    assert server.get("/hello")[0] == 200
    if kind == "forkserve":  # Gunicorn says nothing; forkserve says what has no effect
        log = server.log()
        assert "threads = 4 has no effect under forkserve" in log
        assert "worker_tmp_dir = '/dev/shm' has no effect under forkserve" in log


def test_check_config_names_every_problem_in_one_run(tmp_path):
    conf = tmp_path / "gunicorn.conf.py"
    conf.write_text(CONTAINER_CONF + "reuse_port = True\nacesslog = '-'\n")
    done = subprocess.run([sys.executable, "-m", "forkserve", "--check-config", "-c", str(conf),
                           "flask_site:app"], cwd=COMPAT, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    assert [line.partition(": ")[2].partition(":")[0] for line in lines] == [
        "warning", "warning", "error", "error"], lines
    assert "threads = 4 has no effect" in lines[0] and "worker_tmp_dir" in lines[1]
    assert "reuse_port = True" in lines[2] and "unknown setting 'acesslog'" in lines[3]
    conf.write_text(CONTAINER_CONF)
    done = subprocess.run([sys.executable, "-m", "forkserve", "--check-config", "-c", str(conf),
                           "flask_site:app"], cwd=COMPAT, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert "threads = 4 has no effect" in done.stderr
    assert "configuration OK (2 setting(s) with no effect, see above)" in done.stderr


# --- SCRIPT_NAME: the application mounted under a prefix, as Gunicorn mounts it ---

def _mounted(port, path):
    """(status, whether a refusal closed the connection, 'SCRIPT_NAME PATH_INFO' seen
    by the app); Gunicorn's sync worker closes every connection, so a 200's is not
    compared."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: t\r\n\r\n".encode())
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
            head, _, body = data.partition(b"\r\n\r\n")
            if body and b"Content-Length: %d" % len(body) in head:
                break
        status = int(data.split(b" ", 2)[1])
    if status == 200:
        return status, None, json.loads(body)["mounted"]
    return status, b"connection: close" in data.lower(), None


@pytest.mark.parametrize("how", ["--env", "environment"])
def test_script_name_mounts_the_application_as_gunicorn_does(servers, how):
    args, env = (("--env", "SCRIPT_NAME=/prefix"), None) if how == "--env" \
        else ((), {"SCRIPT_NAME": "/prefix"})
    paths = ["/prefix", "/prefix/", "/prefix/mounted/a%20b?q=1", "/prefixed", "/other", "/",
             "/pre%66ix/x"]
    seen = {}
    for kind in ("gunicorn", "forkserve"):
        server = servers(kind, *args, app="flask_site:mounted", env=env)
        seen[kind] = [_mounted(server.port, path) for path in paths]
    assert seen["forkserve"] == seen["gunicorn"], seen
    assert seen["forkserve"][2] == (200, None, "/prefix /mounted/a b")
    assert seen["forkserve"][4][:2] == (500, True)  # outside the prefix: Gunicorn's 500
