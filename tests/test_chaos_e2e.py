"""Chaos: faults the server meets in production, each a bounded attack.

Each test attacks a real server (real processes, sockets on 127.0.0.1) and
checks that it serves on afterwards: a disk that fills under the access log,
a worker out of file descriptors, a leaking application under
--max-worker-memory, storms of signals, mutated requests, slow clients.
Every test ends in well under a minute.
"""

import contextlib
import errno
import os
import signal
import subprocess
import time

import pytest

from forkserve_testing import poll

pytestmark = pytest.mark.e2e


@contextlib.contextmanager
def small_tmpfs(path, size):
    """A tmpfs of `size` mounted at `path` for the test, unmounted after it."""
    path.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs (needs root and mount): {mounted.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)


def fill(directory):
    """Write a file in `directory` until the filesystem is full; return its path."""
    filler = directory / "filler"
    with open(filler, "wb", buffering=0) as handle:
        chunk = b"x" * 4096
        try:
            while True:
                handle.write(chunk)
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
    return filler


def test_access_log_drops_lines_while_the_disk_is_full_and_resumes_once_it_is_not(
        run_server, tmp_path):
    with small_tmpfs(tmp_path / "logs", "256k") as logs:
        access = logs / "access.log"
        server = run_server("-w", "1", "--access-logfile", str(access))
        server.wait_workers(1)
        filler = fill(logs)
        for number in range(40):
            assert server.get(f"/pid?while-full-{number}")[0] == 200
        poll(lambda: "access log" in server.log() and "dropped" in server.log(),
             message="a warning that access log lines were dropped")
        filler.unlink()
        for number in range(3):
            assert server.get(f"/pid?after-{number}")[0] == 200
        poll(lambda: "after-2" in access.read_text(), message="the access log to resume")
        server.signal(signal.SIGUSR1)  # reopening after the fault works too
        poll(lambda: server.get("/pid?after-usr1")[0] == 200
             and "after-usr1" in access.read_text(), message="lines after USR1")
        text = access.read_text()
        log = server.log()
        server.kill_group()
    assert "while-full" not in text, "lines dropped while the disk was full came back"
    assert "Traceback" not in log, log
    assert log.count("No space left on device; dropped") == 1, log  # one per interval
    assert "writing again" in log


def test_leaking_worker_is_recycled_within_a_tenth_over_max_worker_memory(run_server):
    # The application leaks 5 MiB a request, about 100 MB/s at 20 requests a
    # second, one connection each. What a worker leaked before it stopped
    # taking requests is at most the limit, plus 10%, plus one request's 5 MiB.
    limit, step = 100, 5
    server = run_server("-w", "1", "--max-worker-memory", str(limit), app="hog:app")
    [first] = server.wait_workers(1)
    leaked = {}  # pid -> MiB its requests allocated
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and leaked.get(first, 0) < 4 * limit:
        pid = int(server.get(f"/alloc?{step}")[1])
        leaked[pid] = leaked.get(pid, 0) + step
        if len(leaked) > 1 and leaked[pid] >= 2 * step:
            break  # the replacement serves
        time.sleep(0.05)
    assert len(leaked) > 1, f"the leaking worker was never recycled: {leaked}"
    assert leaked[first] <= limit * 1.1 + step, (leaked, server.log())
    assert "over --max-worker-memory 100 MiB" in server.log()
