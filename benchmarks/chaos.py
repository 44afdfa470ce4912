"""Attacks on forkserve and Gunicorn side by side: what fails, how long until
the server serves again, what it leaves behind.

    python benchmarks/chaos.py                      # every attack, both servers
    python benchmarks/chaos.py --attacks hup,mutated --rows 20000
    python benchmarks/chaos.py --no-result          # print the table only
    python benchmarks/chaos.py --quick --no-result  # hup and mutated, 20,000 records

Each attack starts a fresh server, ``python -m forkserve -w 4`` or
``gunicorn -k gevent --preload -w 4``, on benchmarks/apps/chaos_app.py (a
200,000-record dataset built in the master; /alloc leaks on request), on
127.0.0.1 port 0, in its own process group:

    kill       SIGKILL a worker, then each replacement 50 ms after it appears,
               10 times, under load: does the server still serve
    hup        20 HUPs 50 ms apart under load (3 clients, fresh connections)
    ttin-ttou  16 TTIN/TTOU signals 20 ms apart under load
    usr1       5 log rotations (rename, USR1) under load; access lines lost
    mutated    1,000 mutated requests (8 clients; each sends and half-closes):
               invalid responses and hangs (no answer nor close in 10 s)
    slowloris  60 connections sending one header byte every 0.2 s for up to
               20 s, under load; forkserve with --header-timeout 5 (Gunicorn
               has no header timeout)
    fds        the server under `ulimit -n 64` (setrlimit before exec), 400
               idle connections held 35 s (past the 30 s title reading) under
               load; workers that died
    full-disk  the access log on a 256 KiB tmpfs filled up, 100 requests,
               space freed, 20 requests: lines of those 20 missing, stale
               lines that came back (needs root and mount)
    leak       one client leaking 5 MiB a request, 20 a second (~100 MB/s)
               for 8 s; forkserve with --max-worker-memory 200 (Gunicorn has
               no memory limit): the most one worker leaked

For each: failed/total requests of the load (an error, or not 200),
recovery (seconds from the attack's end until 20 requests in a row
succeed; "—": not within 60 s), and processes left behind (members of the
server's process group alive 15 s after TERM to the master; then they are
killed). Prints the dated table with the machine's load and CPU steal, and
writes the rows to benchmarks/results/chaos/result.json, unless --no-result.
"""

import argparse
import contextlib
import errno
import http.client
import os
import random
import re
import resource
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from benchmarks.harness.machine import Conditions, add_common_options, parse_quick  # noqa: E402
from benchmarks.harness.procs import group_members  # noqa: E402
from benchmarks.harness.results import Result, command_line  # noqa: E402

LISTENING = re.compile(r"Listening at: http://127\.0\.0\.1:(\d+)")
BOOTED = re.compile(r"Booting worker (?:\d+ )?with pid: (\d+)")
STATUS_LINE = re.compile(rb"HTTP/1\.[01] [1-5]\d\d[ \r]")
RESULTS = os.path.join(HERE, "results", "chaos")
WORKERS = 4

#: the figures benchmarks/README.md shows of a run's rows (benchmarks.harness.index)
RESULT_COLUMNS = (
    ("attack", "attack"), ("server", "server"), ("failed", "failed"), ("total", "requests"),
    ("recovery", "recovery", "s"), ("left", "processes left"), ("note", "notes"),
)


#: the servers' interpreter (--python)
PYTHON = sys.executable
QUICK = {"attacks": "hup,mutated", "rows": 20_000}


def command(server, extra):
    if server == "forkserve":
        return [PYTHON, "-m", "forkserve", "-w", str(WORKERS), "-b", "127.0.0.1:0",
                "--graceful-timeout", "10", *extra.get("forkserve", ()), "chaos_app:app"]
    return [PYTHON, "-m", "gunicorn", "-k", "gevent", "--preload", "-w", str(WORKERS),
            "-b", "127.0.0.1:0", "--graceful-timeout", "10", *extra.get("gunicorn", ()),
            "chaos_app:app"]


class Server:
    """One server under attack, in its own process group, its log in a file."""

    def __init__(self, name, workdir, rows, extra=None, nofile=None):
        self.name = name
        self.log_path = os.path.join(workdir, f"{name}-{time.monotonic_ns()}.log")
        self.log_file = open(self.log_path, "wb")
        # Run from the work directory, the app found through PYTHONPATH: both
        # servers read a gunicorn.conf.py in their working directory, and
        # benchmarks/apps/ has one (the gunicorn-gc hooks) that is not for here.
        env = dict(os.environ, CHAOS_ROWS=str(rows), PYTHONUNBUFFERED="1",
                   PYTHONPATH=os.pathsep.join(filter(None, [os.path.join(HERE, "apps"),
                                                            os.environ.get("PYTHONPATH")])))
        env.pop("FORKSERVE_WORKERS", None)

        def limit():
            if nofile:
                resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
        self.proc = subprocess.Popen(command(name, extra or {}), cwd=workdir, env=env,
                                     stdout=self.log_file, stderr=subprocess.STDOUT,
                                     start_new_session=True, preexec_fn=limit)
        self.port = None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {self.proc.returncode}:\n{self.log()}")
            match = LISTENING.search(self.log())
            if match and len(BOOTED.findall(self.log())) >= WORKERS and self.ok("/pid"):
                self.port = int(match.group(1))
                return
            if match:
                self.port = int(match.group(1))
            time.sleep(0.1)
        raise RuntimeError(f"{name} did not start in 60 s:\n{self.log()}")

    def log(self):
        with open(self.log_path, "rb") as handle:
            return handle.read().decode("utf-8", "replace")

    def get(self, path, timeout=10):
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            connection.request("GET", path)
            response = connection.getresponse()
            return response.status, response.read().decode("utf-8", "replace")
        finally:
            connection.close()

    def ok(self, path):
        if self.port is None:
            return False
        try:
            return self.get(path, timeout=5)[0] == 200
        except (OSError, http.client.HTTPException):
            return False

    def signal(self, signum):
        os.kill(self.proc.pid, signum)

    def recovery(self, started, limit=60):
        """Seconds from `started` until 20 requests in a row succeed (None: not in `limit`)."""
        in_a_row = 0
        while time.monotonic() - started < limit:
            in_a_row = in_a_row + 1 if self.ok("/pid") else 0
            if in_a_row == 20:
                return time.monotonic() - started
            if not in_a_row:
                time.sleep(0.05)
        return None

    def stop(self):
        """TERM the master; the group's members still alive 15 s later (then killed)."""
        try:
            self.signal(15)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and group_members(self.proc.pid):
            self.proc.poll()
            time.sleep(0.1)
        left = len(group_members(self.proc.pid))
        try:
            os.killpg(self.proc.pid, 9)
        except ProcessLookupError:
            pass
        self.proc.wait(10)
        self.log_file.close()
        return left


class Counts:
    def __init__(self):
        self.ok = self.failed = 0
        self.lock = threading.Lock()

    def add(self, good):
        with self.lock:
            if good:
                self.ok += 1
            else:
                self.failed += 1


@contextlib.contextmanager
def Load(server, clients=3):
    """`clients` threads asking /pid on fresh connections while the block runs;
    yields their Counts."""
    counts, stop = Counts(), threading.Event()

    def client():
        while not stop.is_set():
            try:
                good = server.get("/pid")[0] == 200
            except (OSError, http.client.HTTPException):
                good = False
            counts.add(good)
            if not good:
                time.sleep(0.01)  # a refused connection fails at once: no busy loop
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    try:
        yield counts
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)


def row(failed, total, recovery, left, note=""):
    return {"failed": failed, "total": total, "recovery": recovery, "left": left, "note": note}


def under_load(server, attack, settle=1.0):
    """Run attack() under load; the row for it (the load goes on until recovered)."""
    with Load(server) as load:
        time.sleep(settle)  # some load before the attack, not a synchronisation
        note = attack() or ""
        ended = time.monotonic()
        recovery = server.recovery(ended)
        time.sleep(settle)
    return row(load.failed, load.ok + load.failed, recovery, server.stop(), note)


def attack_hup(name, workdir, rows):
    server = Server(name, workdir, rows)

    def storm():
        for _ in range(20):
            server.signal(1)
            time.sleep(0.05)
    return under_load(server, storm)


def attack_ttin_ttou(name, workdir, rows):
    server = Server(name, workdir, rows)

    def storm():
        for signum in [21] * 6 + [22] * 6 + [21, 22] * 2:  # TTIN, TTOU
            server.signal(signum)
            time.sleep(0.02)
    return under_load(server, storm)


def attack_usr1(name, workdir, rows):
    directory = tempfile.mkdtemp(dir=workdir)
    access = os.path.join(directory, "access.log")
    extra = {"forkserve": ["--access-logfile", access], "gunicorn": ["--access-logfile", access]}
    server = Server(name, workdir, rows, extra)
    with Load(server) as load:
        for rotation in range(5):
            time.sleep(0.5)  # the load between rotations
            os.rename(access, f"{access}.{rotation}")
            server.signal(10)
        time.sleep(0.5)
        ended = time.monotonic()
        recovery = server.recovery(ended)
    left = server.stop()  # flushes what the workers still held

    def lines():
        return sum(open(os.path.join(directory, entry)).read().count(" /pid ")
                   for entry in os.listdir(directory))
    logged = lines()
    answered = load.ok + 20  # recovery's own 20 requests
    lost = max(0, answered - logged)
    return row(load.failed, load.ok + load.failed, recovery, left,
               f"access lines lost: {lost} of {answered}")


def mutate(valid, rng):
    """`valid` with a few bytes replaced, inserted, duplicated or cut
    (tests/test_chaos_e2e.py sends the same kind of batch)."""
    data = bytearray(valid)
    mutants = b"\r\n\t :;,\x00\x7f\xff-0123456789aZ/%\"\\"
    for _ in range(rng.randint(1, 4)):
        at = rng.randrange(len(data))
        kind = rng.random()
        if kind < 0.4:
            data[at] = rng.choice(mutants)
        elif kind < 0.7:
            data[at:at] = bytes([rng.choice(mutants)]) * rng.choice((1, 1, 2, 300))
        elif kind < 0.85:
            del data[at:at + rng.randint(1, 8)]
        else:
            data[at:at] = data[at:at + rng.randint(1, 40)]
    return bytes(data)


#: the valid requests the mutations start from
SEEDS = (
    b"GET /pid?a=1 HTTP/1.1\r\nHost: t\r\nUser-Agent: chaos\r\nAccept: */*\r\n\r\n",
    b"POST /pid HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\nContent-Type: text/plain\r\n\r\n"
    b"hello",
    b"POST /pid HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"5\r\nhello\r\n0\r\n\r\n",
    b"GET /pid HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
)


def exchange(port, data, timeout=10, tls=None):
    """The server's bytes for `data` (sent, then our side closed), or None if
    it neither answered nor closed within `timeout`. With `tls`, a client's
    ssl.SSLContext, over TLS; our side is then not closed (a TLS socket cannot
    half-close and still read), so an unfinished request waits for the
    server's timeouts."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as plain:
        if tls is None:
            return _exchange(plain, data, half_close=True)
        with tls.wrap_socket(plain, server_hostname="localhost") as sock:
            return _exchange(sock, data, half_close=False)


def _exchange(sock, data, half_close):
    try:
        sock.sendall(data)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
    except OSError:
        pass
    received = b""
    try:
        while chunk := sock.recv(65536):
            received += chunk
    except ConnectionResetError:
        pass
    except ssl.SSLError:  # closed without close_notify, or mid-record
        pass
    except socket.timeout:
        return None
    return received


def attack_mutated(name, workdir, rows, count=1000):
    server = Server(name, workdir, rows)
    rng = random.Random(22)
    batch = [mutate(rng.choice(SEEDS), rng) for _ in range(count)]
    counts = {"invalid": 0, "hung": 0, "closed": 0}
    lock = threading.Lock()

    def client(requests):
        for data in requests:
            received = exchange(server.port, data)
            kind = ("hung" if received is None else "closed" if not received
                    else None if STATUS_LINE.match(received) else "invalid")
            if kind:
                with lock:
                    counts[kind] += 1
    threads = [threading.Thread(target=client, args=(batch[i::8],)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    recovery = server.recovery(time.monotonic())
    return row(counts["invalid"] + counts["hung"], count, recovery, server.stop(),
               f"invalid {counts['invalid']}, hung {counts['hung']}, "
               f"closed without an answer {counts['closed']}")


def attack_slowloris(name, workdir, rows):
    server = Server(name, workdir, rows, {"forkserve": ["--header-timeout", "5"]})
    slow = [socket.create_connection(("127.0.0.1", server.port), timeout=10)
            for _ in range(60)]
    closed = set()

    def attack():
        started = time.monotonic()
        for sock in slow:
            sock.sendall(b"GET /pid HTTP/1.1\r\nHost: t\r\nX-a: ")
        while len(closed) < len(slow) and time.monotonic() - started < 20:
            for index, sock in enumerate(slow):
                if index not in closed:
                    try:
                        sock.sendall(b"a")
                    except OSError:
                        closed.add(index)
            time.sleep(0.2)  # the attack's pace
        held = time.monotonic() - started
        return (f"slow connections closed by the server: {len(closed)} of {len(slow)} "
                f"(in {held:.0f} s)")
    try:
        return under_load(server, attack)
    finally:
        for sock in slow:
            sock.close()


def attack_fds(name, workdir, rows):
    server = Server(name, workdir, rows, nofile=64)
    before = set(int(pid) for pid in BOOTED.findall(server.log()))

    def attack():
        idle = []
        try:
            for _ in range(400):
                idle.append(socket.create_connection(("127.0.0.1", server.port), timeout=10))
            time.sleep(35)  # held past the workers' 30 s bookkeeping
        except OSError as exc:
            return f"opening idle connections: {exc}"
        finally:
            for sock in idle:
                sock.close()
        return None
    result = under_load(server, attack)
    booted = set(int(pid) for pid in BOOTED.findall(server.log()))
    result["note"] = (result["note"] or "") + (
        f"workers replaced: {len(booted - before)}")
    return result


def attack_full_disk(name, workdir, rows):
    mount = tempfile.mkdtemp(dir=workdir)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", mount],
                      capture_output=True).returncode != 0:
        return row(None, None, None, None, "skipped: cannot mount a tmpfs (needs root)")
    try:
        access = os.path.join(mount, "access.log")
        server = Server(name, workdir, rows,
                        {"forkserve": ["--access-logfile", access],
                         "gunicorn": ["--access-logfile", access]})
        filler = os.path.join(mount, "filler")
        with open(filler, "wb", buffering=0) as handle:
            try:
                while True:
                    handle.write(b"x" * 4096)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
        failed = 0
        for number in range(100):
            try:
                failed += server.get(f"/pid?full-{number}")[0] != 200
            except (OSError, http.client.HTTPException):
                failed += 1
        time.sleep(1)  # past the access log's flush interval
        os.unlink(filler)
        freed = time.monotonic()
        for number in range(20):
            try:
                failed += server.get(f"/pid?after-{number}")[0] != 200
            except (OSError, http.client.HTTPException):
                failed += 1
        recovery = None
        while time.monotonic() - freed < 15:
            if "after-" in open(access, errors="replace").read():
                recovery = time.monotonic() - freed
                break
            time.sleep(0.1)
        left = server.stop()
        text = open(access, errors="replace").read()
        missing = sum(f"after-{n} " not in text for n in range(20))
        stale = text.count("full-")
        tracebacks = server.log().count("Traceback")
        return row(failed, 120, recovery, left,
                   f"lines after freeing missing: {missing} of 20; stale lines: {stale}; "
                   f"tracebacks in the log: {tracebacks}")
    finally:
        subprocess.run(["umount", "-l", mount], check=False)


def attack_leak(name, workdir, rows, limit=200, step=5):
    server = Server(name, workdir, rows,
                    {"forkserve": ["--max-worker-memory", str(limit)]})
    leaked, failed, total = {}, 0, 0
    ended = time.monotonic() + 8
    while time.monotonic() < ended:
        total += 1
        try:
            status, body = server.get(f"/alloc?{step}")
        except (OSError, http.client.HTTPException):
            failed += 1
            continue
        if status != 200:
            failed += 1
            continue
        pid, megabytes = map(int, body.split())
        leaked[pid] = max(leaked.get(pid, 0), megabytes)
        time.sleep(0.05)  # 20 requests a second: about 100 MB/s
    recovery = server.recovery(time.monotonic())
    limit_note = f"limit {limit} MiB" if name == "forkserve" else "no memory limit"
    return row(failed, total, recovery, server.stop(),
               f"{limit_note}; most one worker leaked: {max(leaked.values(), default=0)} MiB; "
               f"workers that served: {len(leaked)}")


def attack_kill(name, workdir, rows, kills=10):
    server = Server(name, workdir, rows)
    master = server.proc.pid
    seen = set(group_members(master))

    def attack():
        done = 0
        victim = max(seen - {master})  # a serving worker first, then each replacement
        for _ in range(kills):
            try:
                os.kill(victim, 9)
            except ProcessLookupError:
                pass
            done += 1
            deadline = time.monotonic() + 10
            fresh = set()
            while not fresh and time.monotonic() < deadline and server.proc.poll() is None:
                time.sleep(0.01)
                fresh = set(group_members(master)) - seen - {master}
            if not fresh:
                break
            seen.update(fresh)
            victim = min(fresh)
            time.sleep(0.05)  # the replacement's first 50 ms
        alive = "stopped" if server.proc.poll() is not None else "running"
        return f"replacements killed 50 ms after they appeared: {done}; master {alive}"
    return under_load(server, attack)


ATTACKS = {
    "kill": attack_kill,
    "hup": attack_hup,
    "ttin-ttou": attack_ttin_ttou,
    "usr1": attack_usr1,
    "mutated": attack_mutated,
    "slowloris": attack_slowloris,
    "fds": attack_fds,
    "full-disk": attack_full_disk,
    "leak": attack_leak,
}


def table(results, started, conditions):
    lines = [f"Run {started} ({os.cpu_count()} CPUs, shared; {conditions.describe()}), "
             "`python benchmarks/chaos.py`:", "",
             "| attack | server | failed/total | recovery (s) | processes left | notes |",
             "|---|---|---|---|---|---|"]
    for attack, server, result in results:
        failed = ("-" if result["total"] is None
                  else f"{result['failed']}/{result['total']}")
        recovery = "-" if result["recovery"] is None else f"{result['recovery']:.1f}"
        left = "-" if result["left"] is None else str(result["left"])
        lines.append(f"| {attack} | {server} | {failed} | {recovery} | {left} "
                     f"| {result['note']} |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attacks", default=",".join(ATTACKS),
                        help=f"comma-separated, of: {', '.join(ATTACKS)}")
    parser.add_argument("--servers", default="forkserve,gunicorn")
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--no-result", action="store_true",
                        help="print the table only; write no result.json")
    add_common_options(parser, QUICK)
    args = parse_quick(parser, argv, QUICK)
    global PYTHON
    PYTHON = args.python
    unknown = set(args.attacks.split(",")) - set(ATTACKS)
    if unknown:
        parser.error(f"unknown attack(s) {', '.join(sorted(unknown))}; "
                     f"choose from {', '.join(ATTACKS)}")
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    conditions = Conditions()
    workdir = tempfile.mkdtemp(prefix="chaos-")
    results = []
    try:
        for attack in args.attacks.split(","):
            for server in args.servers.split(","):
                print(f"== {attack} on {server}", flush=True)
                result = ATTACKS[attack](server, workdir, args.rows)
                print(f"   {result}", flush=True)
                results.append((attack, server, result))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    conditions.end()
    text = table(results, started, conditions)
    print(text)
    if not args.no_result:
        os.makedirs(RESULTS, exist_ok=True)
        Result.measured("chaos.py", command_line("chaos.py", argv),
                        [dict(result, attack=attack, server=server)
                         for attack, server, result in results],
                        conditions, title="chaos: attacks side by side").write(RESULTS)


if __name__ == "__main__":
    main()
