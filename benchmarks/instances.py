"""Start PersonDB forkserve instances in store mode, for the store benchmarks.

Each instance is a separate `python -m forkserve` (its own master, as a
separate container or systemd unit would be) in its own process group,
bound to 127.0.0.1 port 0; the port is read from its log. `tree` is the
source tree to run (the repository, or a checkout of an older commit to
compare against), put first on PYTHONPATH.
"""

import os
import re
import sys
import time
import urllib.request

from benchmarks.procs import Group

__all__ = ["PersonDBInstance", "start_persondb"]

_LISTENING = re.compile(rb"Listening at: http://127\.0\.0\.1:(\d+)")


class PersonDBInstance:
    """A running instance: its process group, port and log."""

    def __init__(self, group, log_path):
        self.group = group
        self.log_path = log_path
        self.port = None

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}"

    def log(self):
        with open(self.log_path, "rb") as file:
            return file.read()

    def wait_ready(self, workers, timeout):
        """Wait for the port, `workers` workers and a /health answer."""
        deadline = time.monotonic() + timeout
        while True:
            if not self.group.alive():
                raise RuntimeError(f"forkserve exited; its log:\n{self.log()[-3000:].decode()}")
            match = _LISTENING.search(self.log())
            if match and len(self.group.members()) == workers + 1:
                self.port = int(match.group(1))
                try:
                    with urllib.request.urlopen(f"{self.url}/health", timeout=5) as response:
                        if response.status == 200:
                            return
                except OSError:
                    pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"forkserve not ready after {timeout} s; its log:\n"
                                   f"{self.log()[-3000:].decode()}")
            time.sleep(0.1)

    def stop(self):
        self.group.stop()


def start_persondb(tree, *, workers, csv_path, store_path, log_path, cpus=None,
                   python=sys.executable, timeout=300):
    """Start forkserve -w workers on PersonDB (store mode) from `tree`; wait until ready."""
    argv = [python, "-m", "forkserve", "-w", str(workers), "-b", "127.0.0.1:0",
            "examples.persondb.app:app"]
    if cpus:
        argv = ["taskset", "-c", cpus, *argv]
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONUNBUFFERED": "1",
           "PERSONDB_MODE": "store", "PERSONDB_CSV": str(csv_path),
           "PERSONDB_STORE": str(store_path)}
    env.pop("FORKSERVE_WORKERS", None)
    open(log_path, "wb").close()  # a fresh log: the port is read from it
    instance = PersonDBInstance(Group(argv, log_path=log_path, cwd=str(tree), env=env), log_path)
    try:
        instance.wait_ready(workers, timeout)
    except BaseException:
        instance.stop()
        raise
    return instance
