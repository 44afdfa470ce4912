"""Why a process ended: named exit codes, and how the master reads a status.

Workers say why they died through their exit code; the master classifies
what waitpid() reports with `classify()`, which is pure so it can be tested
without processes.
"""

import os
import signal

__all__ = ["WORKER_BOOT_ERROR", "APP_LOAD_ERROR", "CONFIG_ERROR", "BIND_ERROR",
           "WORKER_RESOURCE_ERROR",
           "HaltServer", "Exit", "classify"]

OK = 0
#: the master failed: generic
FAILURE = 1
#: bad settings or command line (argparse uses 2 as well)
CONFIG_ERROR = 2
#: a worker could not start serving (its log says why)
WORKER_BOOT_ERROR = 3
#: the application could not be imported or built
APP_LOAD_ERROR = 4
#: a listening address could not be bound
BIND_ERROR = 5
#: a worker could not start for lack of a resource it can get later (file
#: descriptors: `ulimit -n`); the master retries it with a backoff and never
#: counts it as a boot failure
WORKER_RESOURCE_ERROR = 6

_NAMES = {OK: "exited cleanly", FAILURE: "failed", CONFIG_ERROR: "had a configuration error",
          WORKER_BOOT_ERROR: "failed to boot", APP_LOAD_ERROR: "could not load the application",
          BIND_ERROR: "could not bind",
          WORKER_RESOURCE_ERROR: "ran out of a resource (file descriptors) while starting"}


class HaltServer(BaseException):
    """Stop the master now with `status`. A BaseException so an application
    hook's `except Exception` cannot swallow it."""

    def __init__(self, reason, status=FAILURE):
        super().__init__(reason)
        self.reason = reason
        self.status = status


class Exit:
    """A classified child exit."""

    __slots__ = ("kind", "code", "signum", "description")

    def __init__(self, kind, code=None, signum=None, description=""):
        self.kind = kind          # "clean" | "boot_error" | "error" | "signal"
        self.code = code
        self.signum = signum
        self.description = description

    def __repr__(self):
        return f"Exit({self.kind!r}, code={self.code}, signum={self.signum})"


def classify(status: int) -> Exit:
    """Turn a waitpid() status into an Exit."""
    if os.WIFSIGNALED(status):
        signum = os.WTERMSIG(status)
        try:
            name = signal.Signals(signum).name
        except ValueError:
            name = f"signal {signum}"
        return Exit("signal", signum=signum, description=f"was killed by {name}")
    code = os.waitstatus_to_exitcode(status)
    if code == OK:
        return Exit("clean", code=code, description=_NAMES[OK])
    if code == WORKER_BOOT_ERROR:
        return Exit("boot_error", code=code, description=_NAMES[code])
    return Exit("error", code=code,
                description=f"exited with status {code} ({_NAMES.get(code, 'error')})")
