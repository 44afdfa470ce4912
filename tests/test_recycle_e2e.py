"""Recycling under load (issue 45): workers replaced by --max-requests while
keep-alive clients and clients with a connection per request keep asking
lose no request, and the workers are replaced one at a time, each only once
its replacement serves (forkserve.process.lifecycle decides; these tests
check the real processes carry it out)."""

import http.client
import pathlib
import re
import shutil
import tempfile
import time

import pytest

from forkserve_testing import ClientThreads, poll
from test_keepalive_e2e import KeepAliveClients

pytestmark = pytest.mark.e2e

_EVENT = re.compile(r"Worker (\d+) \(pid (\d+)\) is (recycled|replaced)(.*)"
                    r"|Booting worker (\d+) with pid: (\d+)")


class CountingClients(ClientThreads):
    """`threads` clients until stopped or `seconds` pass, counting answers
    and failures, never retrying."""

    def __init__(self, threads, seconds=240):
        self.deadline = time.monotonic() + seconds
        self.answered = 0
        self.failures = []
        super().__init__(threads)

    def running(self):
        return not self.stop.is_set() and time.monotonic() < self.deadline

    def ask(self, conn, path, headers=None):
        """GET `path` on `conn`; False if the connection failed (it is closed)."""
        try:
            conn.request("GET", path, headers=headers or {})
            response = conn.getresponse()
            response.read()
        except (http.client.HTTPException, OSError) as exc:
            self.failures.append(repr(exc))
            conn.close()
            return False
        if response.status == 200:
            self.answered += 1
        else:
            self.failures.append(response.status)
        return True


class OneShotClients(CountingClients):
    """Each request on a new connection (`Connection: close`)."""

    def __init__(self, port, threads=4):
        self.port = port
        super().__init__(threads)

    def run(self):
        while self.running():
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=15)
            self.ask(conn, "/pid", {"Connection": "close"})
            conn.close()


def recycles(log):
    """[(number, old pid, replacement pid)] in the order the recycles ended;
    asserts from the log's order that one ran at a time and that each old
    worker was told to drain only once its replacement said it serves."""
    under_way, booted, done = {}, {}, []
    for event in _EVENT.finditer(log):
        number, pid, what, rest, booting, new_pid = event.groups()
        if booting:
            booted[int(booting)] = int(new_pid)
        elif what == "recycled":
            # a second one only after the first's replacement took 5 s to say it serves
            assert not under_way or "has not said it serves" in rest, (under_way, event[0])
            under_way[int(number)] = int(pid)
            booted.pop(int(number), None)
        else:
            assert int(number) in booted, f"worker {number} (pid {pid}) told to drain before " \
                                          "its replacement served"
            assert under_way.pop(int(number)) == int(pid)
            done.append((int(number), int(pid), booted.pop(int(number))))
    return done


def test_recycles_under_load_lose_no_request_and_replace_one_worker_at_a_time(run_server):
    server = run_server("-w", "3", "--max-requests", "150", "--graceful-timeout", "10")
    server.wait_workers(3)
    with KeepAliveClients(server.port, threads=6) as kept, \
            OneShotClients(server.port, threads=3) as oneshot:
        poll(lambda: len(recycles(server.log())) >= 12, timeout=180,
             message="12 --max-requests recycles")
    assert kept.failures == [] and oneshot.failures == [], (kept.failures[:5],
                                                            oneshot.failures[:5])
    done = recycles(server.log())
    assert {number for number, _, _ in done} == {1, 2, 3}
    print(f"0 lost of {kept.total} kept-alive and {oneshot.answered} one-shot requests "
          f"across {len(done)} recycles")
    assert kept.total > 0 and oneshot.answered > 0
    # every worker that asked is replaced once the load stops: a recycle queued
    # behind another is not forgotten
    asked = lambda: {int(p) for p in re.findall(r"\[(\d+)\] \[INFO\] worker \d+ served \d+ "
                                                r"requests \(--max-requests\)", server.log())}
    poll(lambda: asked() <= {pid for _, pid, _ in recycles(server.log())}, timeout=30,
         message="every worker that asked to be replaced")


class NginxClients(CountingClients):
    """One thread per path in `paths`, each asking nginx for it over one
    kept-alive connection (a new one after a failure), `pause` seconds apart."""

    def __init__(self, nginx, paths, pause=0.0):
        self.nginx, self.pause, self.paths = nginx, pause, list(paths)
        super().__init__(len(self.paths))

    def run(self):
        path = self.paths.pop()  # each thread its own
        conn = self.nginx.connection(timeout=15)
        while self.running():
            self.ask(conn, path)
            self.stop.wait(self.pause)
        conn.close()


def test_a_uwsgi_ini_s_max_requests_and_reload_on_rss_recycle_behind_nginx_losing_nothing(
        tmp_path):
    # uWSGI's own settings, read from its ini, behind nginx's uwsgi_pass (with
    # upstream keep-alive): workers recycled by max-requests and by
    # reload-on-rss (forkserve's --max-worker-memory) while nginx's clients ask
    from deploy_cluster import Nginx, require_nginx, uwsgi_params
    from forkserve_testing import ServerProcess
    from test_uwsgi_nginx_e2e import APPS
    require_nginx(pytest)
    # nginx's workers run as nobody, who cannot enter pytest's 0700 directories
    directory = pathlib.Path(tempfile.mkdtemp(prefix="forkserve-recycle-"))
    directory.chmod(0o755)
    (directory / "uwsgi_params").write_bytes(uwsgi_params().read_bytes())
    sock = directory / "app.sock"
    ini = directory / "app.ini"
    ini.write_text(f"[uwsgi]\nchdir = {APPS}\nmodule = hog:app\nmaster = true\nprocesses = 2\n"
                   "chmod-socket = 666\nmax-requests = 80\n"
                   "reload-on-rss = 120\ndisable-logging = true\n")
    server = ServerProcess(["--ini", str(ini)], app=None, cwd=APPS, log_dir=tmp_path,
                           bind=f"uwsgi:unix:{sock}")
    nginx = None
    try:
        # the socket file is bound early and listened on late: wait for the workers
        poll(lambda: "Booting worker 2 " in server.log(), 30, message="both workers")
        site = (f"upstream app {{ server unix:{sock}; keepalive 8; }}\nserver {{\n"
                "{listen}  location = / { return 404; }\n"
                f"  location /app/ {{ include {directory}/uwsgi_params; uwsgi_pass app; "
                "uwsgi_param PATH_INFO /seen; }\n"
                f"  location /leak/ {{ include {directory}/uwsgi_params; uwsgi_pass app; "
                "uwsgi_param PATH_INFO /alloc; uwsgi_param QUERY_STRING 5; }\n}\n")
        nginx = Nginx(directory, lambda listen: site.replace(
            "{listen}", "".join(f"  listen {address};\n" for address in listen))).start()
        with NginxClients(nginx, ["/app/"] * 3 + ["/leak/"], pause=0.01) as clients:
            def recycled():
                assert clients.failures == [], clients.failures[:5]
                return ("over --max-worker-memory 120 MiB" in server.log()
                        and len(recycles(server.log())) >= 6)
            poll(recycled, timeout=150, message="recycles by max-requests and reload-on-rss")
        assert clients.failures == [], clients.failures[:5]
        log = server.log()
        assert "(--max-requests): asking to be recycled" in log and "Traceback" not in log
        print(f"0 lost of {clients.answered} through nginx across "
              f"{len(recycles(log))} recycles")
    finally:
        if nginx is not None:
            nginx.stop()
        server.kill_group()
        shutil.rmtree(directory, ignore_errors=True)
