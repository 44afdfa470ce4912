"""Three PersonDB shards behind a real nginx, for tests and benchmarks.

Nothing here picks a port. Each forkserve instance binds 127.0.0.1:0 and
logs its port; nginx is configured once they have, from the very file in
examples/deploy/nginx.conf with the upstream addresses filled in. nginx
cannot listen on port 0 (it refuses the directive), so it listens on a unix
socket in the test's directory and, when a TCP client such as wrk needs
one, on a TCP socket that this process binds on port 0 and hands over the
way nginx's own binary upgrade does: the listening descriptor is inherited
and named in the NGINX environment variable, and the listen directive names
its address.
"""

import http.client
import json
import os
import pathlib
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

from forkserve.store.shards import shard_of
from forkserve_testing import ServerProcess, missing, poll

ROOT = pathlib.Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "examples" / "deploy"
SHARDS = 3

NGINX_MISSING = ("nginx is not installed; these tests run a real nginx. Install it with "
                 "`apt-get update && apt-get install -y nginx` (Debian/Ubuntu; .ci/run does "
                 "this in CI), or put an nginx binary on PATH")

STATS = re.compile(r"Stats at: http://127\.0\.0\.1:(\d+)")


def nginx_binary():
    return shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin:/usr/local/sbin")


def uwsgi_params():
    """The uwsgi_params file the installed nginx ships (beside its nginx.conf):
    what `include uwsgi_params;` reads in a deployed site."""
    found = re.search(r"--conf-path=(\S+)", subprocess.run(
        [nginx_binary(), "-V"], capture_output=True, text=True).stderr)
    return pathlib.Path(found.group(1) if found else "/etc/nginx/nginx.conf").parent / \
        "uwsgi_params"


def require_nginx(pytest):
    """Skip with NGINX_MISSING on a laptop without nginx; fail in CI (CI=true)."""
    if not nginx_binary():
        missing(pytest, NGINX_MISSING)


# -- forkserve instances -------------------------------------------------------

class Instance(ServerProcess):
    """One PersonDB shard served by forkserve, with its stats endpoint."""

    def __init__(self, index, csv_path, log_dir, *, workers=2, bind="127.0.0.1:0", args=()):
        env = {"PERSONDB_CSV": str(csv_path), "PERSONDB_MODE": "store",
               "PERSONDB_SHARD": f"{index}/{SHARDS}"}
        super().__init__(["-w", str(workers), "--stats", "127.0.0.1:0", *args],
                         app="examples.persondb.app:app", env=env, cwd=ROOT, log_dir=log_dir,
                         bind=bind)
        self.index = index
        self.stats_port = None

    def wait_ready(self, timeout=60):
        self.wait_listening(timeout)
        self.stats_port = int(poll(lambda: STATS.search(self.log()), timeout,
                                   message="the Stats at: line").group(1))
        poll(lambda: self.health() == 200, timeout, message=f"shard {self.index} /health")
        return self

    @property
    def stats_address(self):
        return f"127.0.0.1:{self.stats_port}"

    def health(self):
        try:
            return self.get("/health", timeout=5)[0]
        except OSError:
            return None

    def stats(self):
        with urllib.request.urlopen(f"http://{self.stats_address}/json", timeout=10) as response:
            return json.load(response)


def start_instances(csv_path, log_dir, **kwargs):
    instances = [Instance(index, csv_path, log_dir, **kwargs) for index in range(SHARDS)]
    for instance in instances:
        instance.wait_ready()
    return instances


# -- nginx ------------------------------------------------------------------------

def site_config(ports, listen, replicas=None):
    """examples/deploy/nginx.conf with shard i at 127.0.0.1:ports[i], listening on `listen`.

    replicas: {shard: [port, ...]}, more servers of a shard, added to its
    upstream as the file's comment says.
    """
    text = (DEPLOY / "nginx.conf").read_text()
    for index, port in enumerate(ports):
        extra = "".join(f"\n    server 127.0.0.1:{other}\\2"
                        for other in (replicas or {}).get(index, ()))
        text, count = re.subn(rf"(upstream shard{index} {{\s*server )127\.0\.0\.1:\d+(.*)",
                              rf"\g<1>127.0.0.1:{port}\2{extra}", text)
        assert count == 1, f"examples/deploy/nginx.conf has no server line for shard{index}"
    text, count = re.subn(r"^    listen 127\.0\.0\.1:8080;$",
                          "\n".join(f"    listen {address};" for address in listen), text,
                          flags=re.MULTILINE)
    assert count == 1, "examples/deploy/nginx.conf has no `listen 127.0.0.1:8080;` line"
    return text


class Nginx:
    """A real nginx (master + workers) serving a site that answers 404 at /.

    site(listen) returns the http-context configuration for the given
    listen addresses; Nginx.for_shards() gives examples/deploy/nginx.conf.
    """

    @classmethod
    def for_shards(cls, directory, ports, *, replicas=None, **kwargs):
        return cls(directory, lambda listen: site_config(ports, listen, replicas), **kwargs)

    def __init__(self, directory, site, *, tcp=False, worker_processes=1):
        self.directory = pathlib.Path(directory)
        self.socket_path = str(self.directory / "nginx.sock")
        self.tcp_listener = None
        listen = [f"unix:{self.socket_path}"]
        if tcp:
            self.tcp_listener = socket.socket()
            self.tcp_listener.bind(("127.0.0.1", 0))
            self.tcp_listener.listen(1024)
            self.tcp_listener.set_inheritable(True)
            listen.append(f"127.0.0.1:{self.port}")
        (self.directory / "site.conf").write_text(site(listen))
        temp = self.directory / "nginx-temp"
        temp.mkdir(exist_ok=True)
        paths = " ".join(f"{kind}_temp_path {temp}/{kind};"
                         for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
        self.error_log = self.directory / "nginx-error.log"
        (self.directory / "nginx-main.conf").write_text(
            f"daemon off;\nworker_processes {worker_processes};\n"
            f"pid {self.directory}/nginx.pid;\nerror_log {self.error_log} info;\n"
            "events { worker_connections 1024; }\n"
            f"http {{\n    access_log off;\n    {paths}\n"
            f"    include {self.directory}/site.conf;\n}}\n")
        self.proc = None

    @property
    def port(self):
        return self.tcp_listener.getsockname()[1]

    def start(self, timeout=20):
        env = dict(os.environ)
        fds = []
        if self.tcp_listener is not None:
            fds.append(self.tcp_listener.fileno())
            env["NGINX"] = f"{self.tcp_listener.fileno()};"
        self.proc = subprocess.Popen(
            [nginx_binary(), "-p", str(self.directory), "-c", str(self.directory / "nginx-main.conf")],
            env=env, pass_fds=fds, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
            start_new_session=True)
        poll(self._answers, timeout, message="nginx to answer on its unix socket")
        return self

    def _answers(self):
        if self.proc.poll() is not None:
            raise AssertionError(f"nginx exited with {self.proc.returncode}:\n{self.log()}")
        try:
            return self.get("/")[0] == 404
        except (FileNotFoundError, ConnectionRefusedError):
            return False

    def log(self):
        try:
            return self.error_log.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def connection(self, timeout=10):
        return UnixHTTPConnection(self.socket_path, timeout=timeout)

    def get(self, path, timeout=10):
        """GET path: (status, headers dict, body bytes), on a fresh connection."""
        connection = self.connection(timeout)
        try:
            connection.request("GET", path)
            response = connection.getresponse()
            return response.status, dict(response.getheaders()), response.read()
        finally:
            connection.close()

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGQUIT)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        if self.tcp_listener is not None:
            self.tcp_listener.close()


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path, timeout=10):
        super().__init__("localhost", timeout=timeout)
        self.path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.path)


# -- load -----------------------------------------------------------------------------

class Load:
    """Threads sending GET /person/<email> through nginx back to back, each on
    one keep-alive connection, recording (shard, status, seconds) per request.

    A request that gets no HTTP answer is recorded with status "error" (and
    the connection is opened again). Bounded: stops at stop() or after
    `limit` seconds, whichever comes first.
    """

    def __init__(self, nginx, emails, *, threads=4, limit=120.0):
        self.nginx = nginx
        self.emails = list(emails)
        random.Random(0).shuffle(self.emails)  # every thread visits every shard early on
        self.results = []
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.deadline = time.monotonic() + limit
        self.threads = [threading.Thread(target=self._run, args=(n, threads), daemon=True)
                        for n in range(threads)]

    def __enter__(self):
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc_info):
        self.stop()

    def stop(self):
        self.stopping.set()
        for thread in self.threads:
            thread.join(30)

    def count(self):
        with self.lock:
            return len(self.results)

    def _run(self, offset, step):
        connection = self.nginx.connection()
        emails = self.emails[offset::step]
        n = 0
        while not self.stopping.is_set() and time.monotonic() < self.deadline:
            email = emails[n % len(emails)]
            n += 1
            started = time.monotonic()
            try:
                connection.request("GET", f"/person/{email}")
                response = connection.getresponse()
                response.read()
                status = response.status
                if response.will_close:
                    connection.close()
            except (OSError, http.client.HTTPException):
                status = "error"
                connection.close()
            elapsed = time.monotonic() - started
            with self.lock:
                self.results.append((shard_of(email, SHARDS), status, elapsed))
        connection.close()

    def statuses(self):
        """{shard: {status: count}}"""
        table = {}
        with self.lock:
            for shard, status, _ in self.results:
                counts = table.setdefault(shard, {})
                counts[status] = counts.get(status, 0) + 1
        return table


def emails_by_shard(csv_path, per_shard=None):
    """The CSV's emails grouped by shard: {shard: [email, ...]}."""
    import csv
    groups = {index: [] for index in range(SHARDS)}
    with open(csv_path, newline="", encoding="utf-8") as handle:
        for row in csv.DictReader(handle):
            group = groups[shard_of(row["email"], SHARDS)]
            if per_shard is None or len(group) < per_shard:
                group.append(row["email"])
    return groups


def rolling_reload(*stats_addresses, timeout=120):
    """Run examples/deploy/rolling-reload; return the CompletedProcess."""
    return subprocess.run([sys.executable, str(DEPLOY / "rolling-reload"),
                           "--timeout", str(timeout), *stats_addresses],
                          capture_output=True, text=True, timeout=timeout * len(stats_addresses) + 30)
