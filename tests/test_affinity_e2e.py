"""--cpu-affinity on a real server: each worker runs on the CPU its number
gives (forkserve.process.affinity), read from /proc; a killed worker's
replacement runs on the same CPU; without the flag workers may use every CPU."""

import os
import re
import signal

import pytest

from forkserve.process.affinity import cpu_for
from forkserve_testing import poll

pytestmark = pytest.mark.e2e

WORKER = re.compile(r": worker (\d+) \[")


def cpus_of(pid):
    """The CPUs /proc/PID/status says the process may run on."""
    with open(f"/proc/{pid}/status") as handle:
        listed = next(line for line in handle if line.startswith("Cpus_allowed_list:"))
    cpus = set()
    for part in listed.split(":", 1)[1].strip().split(","):
        low, _, high = part.partition("-")
        cpus.update(range(int(low), int(high or low) + 1))
    return cpus


def workers_by_number(server):
    """{worker number: pid}, from the workers' process titles."""
    found = {}
    for pid in server.children():
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                match = WORKER.search(handle.read().decode(errors="replace"))
        except FileNotFoundError:
            continue
        if match:
            found[int(match.group(1))] = pid
    return found


def test_each_worker_runs_on_its_cpu_and_a_replacement_on_the_same(run_server):
    allowed = os.sched_getaffinity(0)  # the server inherits the test's CPUs
    server = run_server("-w", "3", "--cpu-affinity")
    server.wait_workers(3)
    workers = poll(lambda: (lambda found: found if len(found) == 3 else None)(
        workers_by_number(server)), 10, message="three titled workers")
    for number, pid in workers.items():
        assert cpus_of(pid) == {cpu_for(number, allowed)}, number
    os.kill(workers[2], signal.SIGKILL)
    replacement = poll(lambda: (lambda pid: pid if pid not in (None, workers[2]) else None)(
        workers_by_number(server).get(2)), 20, message="worker 2's replacement")
    assert cpus_of(replacement) == {cpu_for(2, allowed)}
    assert server.get("/")[0] in (200, 404)


def test_without_the_flag_workers_run_on_every_allowed_cpu(run_server):
    allowed = os.sched_getaffinity(0)
    server = run_server("-w", "2")
    for pid in server.wait_workers(2):
        assert cpus_of(pid) == allowed
