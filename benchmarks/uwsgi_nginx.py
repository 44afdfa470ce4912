"""Behind one nginx: forkserve over uwsgi_pass and over proxy_pass, uWSGI over uwsgi_pass.

    python benchmarks/uwsgi_nginx.py                 # 3 rounds x 10 s per path
    python benchmarks/uwsgi_nginx.py --quick         # 1 round x 2 s: a smoke run
    python benchmarks/uwsgi_nginx.py --workers 2 --connections 32 --out /tmp/un
    python benchmarks/uwsgi_nginx.py --max-requests 1000 --workers 3 --out /tmp/recycle

Three backends serve benchmarks/apps/hello_app.py (13 bytes) with --workers
processes each, on unix sockets: forkserve with a uwsgi listener
(`-b uwsgi:unix:...`), forkserve with an HTTP listener, and uWSGI (pyuwsgi,
`--master --processes N --socket ...`, sync workers as most deployments run
it). One nginx (one worker, its stock uwsgi_params) sends /fs-uwsgi/ to the
first with uwsgi_pass, /fs-proxy/ to the second with proxy_pass (HTTP/1.1,
upstream keep-alive: nginx's best case for proxy_pass), /fs-proxy-default/
to the second too with proxy_pass as nginx does it unless told otherwise
(HTTP/1.0, a new upstream connection per request: most sites' setting) and
/uwsgi/ to the third with uwsgi_pass (nginx opens a new upstream connection
per request on both uwsgi paths: its uwsgi module never keeps one). nginx and the backends
are pinned to CPU 0, wrk (--connections keep-alive connections, GET) to CPU 1.

All three backends are started first, then measured in rounds, one path
after the other within a round, so a change in the machine's load hits
each path alike. Figures per path: req/s (responses / wrk's duration) and
p50/p99 (wrk's exact percentiles of the round), each the median over the
rounds; errors summed. uWSGI is left out, with the reason, when pyuwsgi is
not installed (`pip install pyuwsgi`). Writes result.json (the harness's
schema) to --out (benchmarks/results/uwsgi_nginx), and the servers' logs.

What a recycle costs (`--max-requests N`): every path is measured with its
workers recycled after N requests and with --max-requests 0, within each
round, with these paths: forkserve straight (wrk to its HTTP port,
`-w W --max-requests N`), Gunicorn straight (`-k gevent -w W --max-requests
N`), and, behind nginx's uwsgi_pass, forkserve and uWSGI reading one ini
(`master`, `processes = W`, `max-requests = N`, each its own socket). The
servers are restarted for each setting. The rows with N give req/s, p99 and
the slowest response (wrk's max) as ratios to the same path's
--max-requests 0 (rate_x, p99_x, max_x); errors count socket errors too,
and read_errors are wrk's (a server that closes a connection without
saying `Connection: close` shows there). Results go to
benchmarks/results/uwsgi_nginx_recycle unless --out says otherwise.
"""

import argparse
import os
import pathlib
import shlex
import shutil
import socket
import statistics
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from benchmarks.harness.machine import Conditions, add_common_options, parse_quick, say  # noqa: E402
from benchmarks.harness.procs import Group  # noqa: E402
from benchmarks.harness.results import table, write_result  # noqa: E402
from benchmarks.harness.wrk import parse_result, run as wrk_run  # noqa: E402
from deploy_cluster import Nginx, nginx_binary, uwsgi_params  # noqa: E402
from forkserve_testing import poll  # noqa: E402

#: the figures benchmarks/README.md shows of a run's rows (benchmarks.harness.index)
RESULT_COLUMNS = (
    ("path", "path"), ("rounds", "rounds"), ("rate", "req/s"), ("p50_us", "p50"),
    ("p99_us", "p99"), ("errors", "errors"),
)

PATHS = ("fs-uwsgi", "fs-proxy", "fs-proxy-default", "uwsgi")
#: the backend each path goes to, where it is not the path's own name
BACKEND = {"fs-proxy-default": "fs-proxy"}
#: the paths of a --max-requests run: two straight to the server, two behind nginx
RECYCLE_PATHS = ("fs-http", "gunicorn", "fs-ini", "uwsgi-ini")
#: the figures of a --max-requests run's rows
RECYCLE_COLUMNS = (
    ("path", "path"), ("max_requests", "max-requests"), ("rate", "req/s"),
    ("p99_us", "p99"), ("max_us", "slowest"), ("errors", "errors"),
    ("read_errors", "read errors"), ("rate_x", "req/s x"), ("p99_x", "p99 x"),
    ("max_x", "slowest x"),
)
APP_DIR = ROOT / "benchmarks" / "apps"


QUICK = {"rounds": 1, "seconds": 2}


def backends(directory, workers, extra=(), python=sys.executable):
    """{path: (argv, socket path)} of the three backends (uWSGI only if installed);
    `extra`: more forkserve flags."""
    app_dir = str(ROOT / "benchmarks" / "apps")
    forkserve = [python, "-m", "forkserve", "-w", str(workers), "--chdir", app_dir,
                 *extra]
    found = {
        "fs-uwsgi": forkserve + ["-b", f"uwsgi:unix:{directory}/fs-uwsgi.sock", "hello_app:app"],
        "fs-proxy": forkserve + ["-b", f"unix:{directory}/fs-proxy.sock", "hello_app:app"],
    }
    uwsgi = os.path.join(os.path.dirname(python), "uwsgi")  # pyuwsgi's script, beside python
    if os.path.exists(uwsgi):
        found["uwsgi"] = [uwsgi, "--master",
                          "--processes", str(workers), "--chdir", app_dir,
                          "--module", "hello_app:app", "--socket", f"{directory}/uwsgi.sock",
                          "--chmod-socket=666", "--disable-logging", "--die-on-term"]
    return {name: (argv, directory / f"{name}.sock") for name, argv in found.items()}


def recycle_ini(directory, name, workers, max_requests):
    """The ini a --max-requests run's uwsgi_pass backends read, each with its own socket."""
    path = directory / f"{name}-{max_requests}.ini"
    path.write_text(f"[uwsgi]\nchdir = {APP_DIR}\nmodule = hello_app:app\nmaster = true\n"
                    f"processes = {workers}\nsocket = {directory}/{name}.sock\n"
                    "chmod-socket = 666\ndie-on-term = true\ndisable-logging = true\n"
                    f"max-requests = {max_requests}\n")
    return path


def recycle_backends(directory, workers, max_requests, python=sys.executable):
    """{path: argv} of a --max-requests run; Gunicorn takes the listener's
    descriptor as `{fd}` (formatted by `start_recycle`), forkserve logs the
    port it bound."""
    found = {
        "fs-http": [python, "-m", "forkserve", "-w", str(workers), "--max-requests",
                    str(max_requests), "--chdir", str(APP_DIR), "-b", "127.0.0.1:0",
                    "hello_app:app"],
        "gunicorn": [python, "-m", "gunicorn", "-k", "gevent", "-w", str(workers),
                     "--max-requests", str(max_requests), "--chdir", str(APP_DIR),
                     "-c", os.devnull, "-b", "fd://{fd}", "hello_app:app"],
        "fs-ini": [python, "-m", "forkserve", "--ini",
                   str(recycle_ini(directory, "fs-ini", workers, max_requests))],
    }
    uwsgi = os.path.join(os.path.dirname(python), "uwsgi")
    if os.path.exists(uwsgi):
        found["uwsgi-ini"] = [uwsgi, "--ini",
                              str(recycle_ini(directory, "uwsgi-ini", workers, max_requests))]
    return found


def start_recycle(directory, workers, max_requests, python, out):
    """Start a --max-requests run's backends; ({path: url or socket}, [what to stop])."""
    from benchmarks.harness.servers import bind_listener
    from benchmarks.harness.start import start
    where, started = {}, []
    for name, argv in recycle_backends(directory, workers, max_requests, python).items():
        log_path = os.path.join(out, f"{name}-{max_requests}.log")
        if name in ("fs-http", "gunicorn"):  # straight: wrk to its port
            listener = bind_listener() if "fd://{fd}" in argv else None
            fd = listener.fileno() if listener else None
            server = start([arg.format(fd=fd) for arg in argv], log_path=log_path,
                           listener=listener, processes=1 + workers, probe_path="/",
                           cwd=directory)
            started.append(server)
            where[name] = server.url + "/"
        else:
            started.append(Group(argv, log_path=log_path, cwd=directory))
            where[name] = directory / f"{name}.sock"
    for name, sock in where.items():
        if isinstance(sock, pathlib.Path):
            poll(lambda: accepts(sock), 60, message=f"{name} to accept connections")
    return where, started


def measure_recycling(args, directory):
    """{(path, max_requests): [PhaseResult per round]}: each round starts the
    backends with --max-requests 0, measures every path, stops them, then the
    same with --max-requests N."""
    runs = {}
    for number in range(args.rounds):
        for max_requests in (0, args.max_requests):
            where, started = start_recycle(directory, args.workers, max_requests,
                                           args.python, args.out)
            nginx = None
            try:
                behind = [name for name, sock in where.items() if isinstance(sock, pathlib.Path)]
                nginx = Nginx(directory, site(directory, behind), tcp=True).start()
                for name in RECYCLE_PATHS:
                    if name not in where:
                        continue
                    url = (f"http://127.0.0.1:{nginx.port}/{name}/" if name in behind
                           else where[name])
                    result = parse_result(wrk_run(url, args.seconds, args.connections, "1",
                                                  directory))
                    runs.setdefault((name, max_requests), []).append(result)
                    say(f"round {number + 1}/{args.rounds} {name} --max-requests "
                        f"{max_requests}: {result.rate:,.0f} req/s, p99 {result.p99_us} us, "
                        f"slowest {result.max_us} us, {result.errors} errors")
            finally:
                if nginx is not None:
                    nginx.stop()
                for server in started:
                    server.stop(grace=10)
    return runs


def recycle_rows(runs):
    """One row per path and setting; the --max-requests N rows with their ratios to 0."""
    rows = []
    for (name, max_requests), results in runs.items():
        rows.append({"path": name, "max_requests": max_requests, "rounds": len(results),
                     "rate": round(statistics.median(r.rate for r in results), 1),
                     "p50_us": statistics.median(r.p50_us for r in results),
                     "p99_us": statistics.median(r.p99_us for r in results),
                     "max_us": max(r.max_us for r in results),
                     "errors": sum(r.errors for r in results),
                     "read_errors": sum(r.read_errors for r in results)})
    base = {row["path"]: row for row in rows if row["max_requests"] == 0}
    for row in rows:
        zero = base.get(row["path"])
        if row["max_requests"] and zero:
            for key, ratio in (("rate", "rate_x"), ("p99_us", "p99_x"), ("max_us", "max_x")):
                row[ratio] = round(row[key] / zero[key], 3) if zero[key] else None
    return rows


def accepts(path):
    """True once a server listens on the unix socket `path`."""
    probe = socket.socket(socket.AF_UNIX)
    try:
        probe.connect(str(path))
        return True
    except (FileNotFoundError, ConnectionRefusedError):
        return False
    finally:
        probe.close()


def site(directory, names):
    def config(listen):
        lines = ["upstream fs_proxy { server unix:%s/fs-proxy.sock; keepalive 32; }" % directory,
                 "server {", "  access_log off;"]
        lines += [f"  listen {address};" for address in listen]
        lines.append("  location = / { return 404; }")
        for name in names:
            if name == "fs-proxy":
                lines.append("  location /fs-proxy/ { proxy_pass http://fs_proxy; "
                             "proxy_http_version 1.1; proxy_set_header Connection \"\"; }")
            elif name == "fs-proxy-default":  # nginx's defaults: HTTP/1.0, Connection: close
                lines.append(f"  location /fs-proxy-default/ {{ "
                             f"proxy_pass http://unix:{directory}/fs-proxy.sock:; }}")
            else:
                lines.append(f"  location /{name}/ {{ include {directory}/uwsgi_params; "
                             f"uwsgi_pass unix:{directory}/{name}.sock; }}")
        return "\n".join(lines + ["}", ""])
    return config


def measure(nginx, names, rounds, seconds, connections, workdir):
    """{path: [PhaseResult per round]}, the paths in turn within each round."""
    runs = {name: [] for name in names}
    for number in range(rounds):
        for name in names:
            url = f"http://127.0.0.1:{nginx.port}/{name}/"
            runs[name].append(parse_result(wrk_run(url, seconds, connections, "1", workdir)))
            say(f"round {number + 1}/{rounds} {name}: {runs[name][-1].rate:,.0f} req/s, "
                f"p99 {runs[name][-1].p99_us} us")
    return runs


def rows_of(runs):
    return [{"path": name, "rounds": len(results),
             "rate": round(statistics.median(r.rate for r in results), 1),
             "p50_us": statistics.median(r.p50_us for r in results),
             "p99_us": statistics.median(r.p99_us for r in results),
             "errors": sum(r.errors for r in results)}
            for name, results in runs.items()]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--forkserve-flags", default="",
                        help="more flags for both forkserve backends, e.g. '--no-balance'")
    parser.add_argument("--max-requests", type=int, default=0,
                        help="measure what a recycle costs: every path with its workers "
                             "recycled after N requests and with 0 (see above)")
    parser.add_argument("--out", help="where results go (benchmarks/results/uwsgi_nginx, "
                                      "with --max-requests uwsgi_nginx_recycle)")
    add_common_options(parser, QUICK)
    args = parse_quick(parser, argv, QUICK)
    args.out = args.out or str(ROOT / "benchmarks" / "results" / (
        "uwsgi_nginx_recycle" if args.max_requests else "uwsgi_nginx"))
    if not nginx_binary() or not shutil.which("wrk"):
        parser.error("needs nginx and wrk: apt-get install nginx wrk")
    os.makedirs(args.out, exist_ok=True)
    os.sched_setaffinity(0, {0})  # the backends and nginx inherit CPU 0; wrk gets CPU 1
    # nginx's workers run as nobody: the sockets live in a directory they may enter
    directory = pathlib.Path(tempfile.mkdtemp(prefix="forkserve-uwsgi-bench-"))
    directory.chmod(0o755)
    shutil.copy(uwsgi_params(), directory / "uwsgi_params")
    if args.max_requests:
        return recycle_main(args, argv, directory)
    started, nginx = [], None
    try:
        servers = backends(directory, args.workers, shlex.split(args.forkserve_flags), args.python)
        for name, (command, sock) in servers.items():
            started.append(Group(command, log_path=os.path.join(args.out, f"{name}.log"),
                                 cwd=directory))
        for name, (_, sock) in servers.items():  # forkserve binds early, listens late
            poll(lambda: accepts(sock), 60, message=f"{name} to accept connections")
        names = [name for name in PATHS if BACKEND.get(name, name) in servers]
        nginx = Nginx(directory, site(directory, names), tcp=True).start()
        conditions = Conditions()
        runs = measure(nginx, names, args.rounds, args.seconds, args.connections, directory)
        rows = rows_of(runs)
        note = "" if "uwsgi" in servers else "uWSGI not measured: pyuwsgi is not installed"
        path = write_result("uwsgi_nginx.py", argv, rows, conditions.end(), args.out,
                            title="forkserve and uWSGI behind one nginx", note=note)
    finally:
        if nginx is not None:
            nginx.stop()
            if nginx.error_log.exists():
                shutil.copy(nginx.error_log, os.path.join(args.out, "nginx-error.log"))
        for group in started:
            group.stop(grace=10)
        shutil.rmtree(directory, ignore_errors=True)
    print("| path | req/s | p50 us | p99 us | errors |\n|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['path']} | {row['rate']:,.0f} | {row['p50_us']} | {row['p99_us']} | "
              f"{row['errors']} |")
    print(f"{conditions.describe()}; wrote {path}")
    return 0


def recycle_main(args, argv, directory):
    """A --max-requests run: measure, write result.json, print the table."""
    try:
        conditions = Conditions()
        rows = recycle_rows(measure_recycling(args, directory))
        path = write_result("uwsgi_nginx.py", argv, rows, conditions.end(), args.out,
                            title=f"What a recycle costs: --max-requests {args.max_requests} "
                                  "against 0")
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    print("\n".join(table(rows, RECYCLE_COLUMNS)))
    print(f"{conditions.describe()}; wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
