"""--cpu-affinity on a real server, on two of this machine's CPUs (the test
narrows its own affinity before starting the server, which inherits it):
each worker runs on the CPU its number gives (forkserve.process.affinity),
read from /proc; a killed worker's replacement runs on the same CPU; "auto"
pins only while workers outnumber the CPUs."""

import contextlib
import os
import re
import signal

import pytest

from forkserve.process.affinity import cpu_for
from forkserve_testing import poll

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(
    len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to tell pinned from not")]

WORKER = re.compile(r": worker (\d+) \[")


@contextlib.contextmanager
def two_cpus():
    """The two lowest CPUs this process may use; a server started inside
    inherits them as its allowed set."""
    before = os.sched_getaffinity(0)
    two = set(sorted(before)[:2])
    os.sched_setaffinity(0, two)
    try:
        yield two
    finally:
        os.sched_setaffinity(0, before)


def cpus_of(pid):
    """The CPUs /proc/PID/status says the process may run on."""
    with open(f"/proc/{pid}/status") as handle:
        listed = next(line for line in handle if line.startswith("Cpus_allowed_list:"))
    cpus = set()
    for part in listed.split(":", 1)[1].strip().split(","):
        low, _, high = part.partition("-")
        cpus.update(range(int(low), int(high or low) + 1))
    return cpus


def workers_by_number(server, count):
    """{worker number: pid} once `count` workers have titles, else None."""
    found = {}
    for pid in server.children():
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                match = WORKER.search(handle.read().decode(errors="replace"))
        except FileNotFoundError:
            continue
        if match:
            found[int(match.group(1))] = pid
    return found if len(found) == count else None


@pytest.mark.parametrize("mode", ["on", "auto"])
def test_each_worker_runs_on_its_cpu_and_a_replacement_on_the_same(run_server, mode):
    with two_cpus() as cpus:
        server = run_server("-w", "3", "--cpu-affinity", mode)
    server.wait_workers(3)
    workers = poll(lambda: workers_by_number(server, 3), 10, message="three titled workers")
    for number, pid in workers.items():
        assert cpus_of(pid) == {cpu_for(number, cpus)}, number
    assert "Pinning each worker to one of 2 CPUs" in server.log()
    os.kill(workers[2], signal.SIGKILL)
    replacement = poll(lambda: (lambda found: found and found[2] != workers[2] and found[2])(
        workers_by_number(server, 3)), 20, message="worker 2's replacement")
    assert cpus_of(replacement) == {cpu_for(2, cpus)}
    assert server.get("/pid")[0] == 200


@pytest.mark.parametrize("args", [("-w", "2"), ("-w", "3", "--cpu-affinity", "off")])
def test_workers_run_on_every_cpu_with_as_many_cpus_or_off(run_server, args):
    with two_cpus() as cpus:
        server = run_server(*args)
    for pid in server.wait_workers(int(args[1])):
        assert cpus_of(pid) == cpus
    assert "Pinning" not in server.log()
