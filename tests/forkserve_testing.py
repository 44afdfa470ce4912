"""Helpers for end-to-end tests: a forkserve process and an HTTP client."""

import http.client
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

LISTENING = re.compile(r"Listening at: https?://127\.0\.0\.1:(\d+)")  # https: certfile


def ctrl_c_reaches_it():
    """Popen's preexec_fn for a child that a test sends Ctrl-C (SIGINT): an
    ignored SIGINT is inherited (a test run started in the background of a
    non-interactive shell has it), and Python then never raises
    KeyboardInterrupt; a terminal's Ctrl-C always reaches the process."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def missing(pytest, message):
    """A tool a test needs is absent: skip with `message`, or fail with it in
    CI (CI=true), where .ci/run installs every such tool."""
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


def poll(predicate, timeout=10.0, interval=0.05, message="condition"):
    """Call predicate until it returns a true value; fail after timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message}")
        time.sleep(interval)


class ClientThreads:
    """`count` threads running `self.run()` (a subclass's loop, which ends
    when `self.stop` is set or its own deadline passes), started and stopped
    as a context manager."""

    join_timeout = 20

    def __init__(self, count):
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self.run) for _ in range(count)]

    def __enter__(self):
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for thread in self.threads:
            thread.join(self.join_timeout)


class ServerProcess:
    def __init__(self, args, *, app, env=None, cwd=None, log_dir=None, bind="127.0.0.1:0",
                 python_flags=()):
        self.log_path = os.path.join(log_dir, f"server-{time.monotonic_ns()}.log")
        command = [sys.executable, *python_flags, "-m", "forkserve", "-b", bind, *args]
        if app:
            command.append(app)
        environment = dict(os.environ)
        environment.pop("FORKSERVE_WORKERS", None)
        environment["PYTHONUNBUFFERED"] = "1"
        environment.update(env or {})
        self.log_file = open(self.log_path, "w+b")
        self.proc = subprocess.Popen(command, cwd=cwd, env=environment, stdout=self.log_file,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        self.port = None

    @property
    def pid(self):
        return self.proc.pid

    def log(self) -> str:
        with open(self.log_path, "rb") as handle:
            return handle.read().decode("utf-8", "replace")

    def wait_listening(self, timeout=30):
        def listening():
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited with {self.proc.returncode}:\n{self.log()}")
            match = LISTENING.search(self.log())
            return match and int(match.group(1))
        self.port = poll(listening, timeout, message="the Listening at: line")
        return self.port

    def wait_exit(self, timeout=30):
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"server still running after {timeout}s:\n{self.log()}")

    def signal(self, signum):
        os.kill(self.proc.pid, signum)

    def children(self):
        try:
            with open(f"/proc/{self.pid}/task/{self.pid}/children") as handle:
                return [int(pid) for pid in handle.read().split()]
        except FileNotFoundError:
            return []

    def wait_workers(self, count, timeout=20):
        """Wait until exactly `count` workers are serving (and return their pids)."""
        def ready():
            pids = self.children()
            if len(pids) != count:
                return None
            seen = set()
            for _ in range(count * 20):
                seen.add(self.get("/pid")[1])
                if len(seen) == count:
                    return sorted(int(pid) for pid in seen) if set(
                        int(p) for p in seen) == set(pids) else None
            return None
        return poll(ready, timeout, interval=0.1, message=f"{count} serving workers")

    #: a client's ssl.SSLContext for a server started with --certfile: requests go over TLS
    tls = None

    def request(self, method, path, *, body=None, headers=None, timeout=10):
        connection = (http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
                      if self.tls is None else
                      http.client.HTTPSConnection("127.0.0.1", self.port, timeout=timeout,
                                                  context=self.tls))
        try:
            connection.request(method, path, body=body, headers=headers or {})
            response = connection.getresponse()
            return response.status, response.read().decode("utf-8", "replace")
        finally:
            connection.close()

    def get(self, path, **kwargs):
        return self.request("GET", path, **kwargs)

    def get_json(self, path):
        status, body = self.get(path)
        assert status == 200, body
        return json.loads(body)

    def kill_group(self):
        try:
            os.killpg(self.proc.pid, 9)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            pass
        self.log_file.close()


def kill_group(proc, timeout=5):
    """SIGKILL the process group led by `proc` (a Popen started in a new session), reap it."""
    try:
        os.killpg(proc.pid, 9)
    except ProcessLookupError:
        pass
    proc.wait(timeout)
