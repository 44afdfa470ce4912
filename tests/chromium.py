"""A real headless Chromium, driven over the DevTools protocol through a pipe.

`--remote-debugging-pipe` makes Chromium read protocol commands from its fd 3
and write answers and events to its fd 4, each one JSON message ended by a
NUL byte: no port, no websocket, nothing a test can race for. `Browser`
opens a page, collects what its console and its script report, and
evaluates expressions in it. Debian's package: apt-get install -y chromium.
"""

import fcntl
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time

from forkserve_testing import missing

__all__ = ["Browser", "ChromiumError", "MISSING", "find"]

MISSING = ("chromium is not installed: apt-get update && apt-get install -y chromium "
           "(Debian's package; .ci/run installs it)")

#: headless, offline, no state kept between runs (a fresh --user-data-dir)
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--remote-debugging-pipe")


class ChromiumError(Exception):
    pass


def find():
    """The chromium executable, or None."""
    return shutil.which("chromium") or shutil.which("chromium-browser")


def require(pytest):
    """The executable; skip with MISSING where it is absent, fail instead in CI (CI=true)."""
    executable = find()
    if executable is None:
        missing(pytest, MISSING)
    return executable


def _above(lowest, fd):
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD, lowest + 1)
    os.close(fd)
    return moved


class Browser:
    """One Chromium process and one page in it."""

    def __init__(self, executable, profile, log_path, window=(1200, 900)):
        commands_r, self._commands = os.pipe()
        self._answers, answers_w = os.pipe()
        # A small launcher puts the pipe ends where Chromium expects them, 3
        # and 4; they are moved above 4 first, so that neither already is 3 or 4.
        commands_r, answers_w = (_above(4, fd) for fd in (commands_r, answers_w))
        launch = ("import os, sys; os.dup2(int(sys.argv[1]), 3); os.dup2(int(sys.argv[2]), 4);"
                  " os.execv(sys.argv[3], sys.argv[3:])")
        with open(log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-c", launch, str(commands_r), str(answers_w), executable,
                 *FLAGS, f"--user-data-dir={profile}", f"--window-size={window[0]},{window[1]}",
                 "about:blank"],
                pass_fds=(commands_r, answers_w), stdin=subprocess.DEVNULL,
                stdout=log, stderr=log, start_new_session=True)
        os.close(commands_r)
        os.close(answers_w)
        self._buffer = b""
        self._next_id = 0
        self.events = []  # (session, method, params) of every event seen
        self.session = None

    def close(self):
        try:
            if self.process.poll() is None:
                self._send("Browser.close", {}, None)
                self.process.wait(timeout=10)
        except (ChromiumError, OSError, subprocess.TimeoutExpired):
            pass  # it is killed below
        finally:
            if self.process.poll() is None:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
            os.close(self._commands)
            os.close(self._answers)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- the protocol --

    def _send(self, method, params, session):
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params}
        if session is not None:
            message["sessionId"] = session
        data = json.dumps(message).encode() + b"\0"
        while data:
            data = data[os.write(self._commands, data):]
        return self._next_id

    def call(self, method, params=None, *, page=True, timeout=30.0):
        """Send a command (to the page once one is open) and return its result."""
        wanted = self._send(method, params or {}, self.session if page else None)
        deadline = time.monotonic() + timeout
        while True:
            message = self._receive(deadline, f"the answer to {method}")
            if message.get("id") == wanted:
                if "error" in message:
                    raise ChromiumError(f"{method}: {message['error']}")
                return message.get("result", {})

    def _receive(self, deadline, waiting_for):
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._answers], [], [], left)[0]:
                raise ChromiumError(f"no {waiting_for} from chromium in time")
            chunk = os.read(self._answers, 65536)
            if not chunk:
                raise ChromiumError(f"chromium exited (status {self.process.poll()}) "
                                    f"before {waiting_for}")
            self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        message = json.loads(raw)
        if "method" in message:
            self.events.append((message.get("sessionId"), message["method"],
                                message.get("params", {})))
        return message

    def pump(self, seconds):
        """Collect events for up to `seconds`."""
        deadline = time.monotonic() + seconds
        try:
            while True:
                self._receive(deadline, "event")
        except ChromiumError:
            if self.process.poll() is not None:
                raise

    # -- a page --

    def open(self, url):
        """Open url in a new page that reports its console and errors."""
        target = self.call("Target.createTarget", {"url": "about:blank"}, page=False)
        self.session = self.call("Target.attachToTarget",
                                 {"targetId": target["targetId"], "flatten": True},
                                 page=False)["sessionId"]
        for domain in ("Runtime", "Log", "Page"):
            self.call(f"{domain}.enable")
        self.call("Page.navigate", {"url": url})

    def evaluate(self, expression):
        """The value of a JavaScript expression in the page (JSON-able)."""
        result = self.call("Runtime.evaluate", {"expression": expression,
                                                "returnByValue": True})
        if "exceptionDetails" in result:
            raise ChromiumError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def problems(self):
        """What the page reported as wrong: uncaught exceptions, console errors
        and warnings, failed loads and other error-level log entries."""
        found = []
        for session, method, params in self.events:
            if session != self.session:
                continue
            if method == "Runtime.exceptionThrown":
                found.append(f"exception: {params['exceptionDetails']}")
            elif method == "Runtime.consoleAPICalled" and params["type"] in (
                    "error", "warning", "assert"):
                found.append(f"console.{params['type']}: {params['args']}")
            elif method == "Log.entryAdded" and params["entry"]["level"] in ("error", "warning"):
                found.append(f"log: {params['entry']}")
        return found

    def screenshot(self, path):
        import base64
        data = self.call("Page.captureScreenshot", {"format": "png"})["data"]
        with open(path, "wb") as out:
            out.write(base64.b64decode(data))
