"""--cpu-affinity's choice of CPU (forkserve.process.affinity), without
pinning anything: the kernel calls are passed in."""

import errno
import logging

import pytest

from forkserve.config import ignored, settings
from forkserve.process import affinity


def test_workers_spread_evenly_over_the_allowed_cpus_in_ascending_order():
    allowed = {5, 1, 3}
    assert [affinity.cpu_for(n, allowed) for n in range(1, 8)] == [1, 3, 5, 1, 3, 5, 1]


@pytest.mark.parametrize("cpus,workers", [(2, 4), (2, 3), (4, 4), (3, 8), (1, 5)])
def test_no_cpu_holds_two_workers_more_than_another(cpus, workers):
    allowed = set(range(10, 10 + cpus))
    chosen = [affinity.cpu_for(n, allowed) for n in range(1, workers + 1)]
    counts = [chosen.count(cpu) for cpu in allowed]
    assert set(chosen) <= allowed
    assert max(counts) - min(counts) <= 1


def test_pin_sets_the_chosen_cpu_of_the_allowed_set():
    calls = []
    cpu = affinity.pin(4, getaffinity=lambda pid: {0, 2, 6},
                       setaffinity=lambda pid, cpus: calls.append((pid, cpus)))
    assert cpu == 0 and calls == [(0, {0})]


def test_a_refused_pin_is_a_warning_and_the_worker_runs_on(caplog):
    def refuse(pid, cpus):
        raise OSError(errno.EINVAL, "Invalid argument")
    with caplog.at_level(logging.WARNING, logger="forkserve.error"):
        assert affinity.pin(2, getaffinity=lambda pid: {0, 1}, setaffinity=refuse) is None
    assert "worker 2: --cpu-affinity could not pin it to CPU 1 (Invalid argument)" in caplog.text


def test_cpu_affinity_is_off_by_default_and_moot_with_w0():
    assert settings.parse(["app:app"], environ={}).cpu_affinity is False
    cfg = settings.parse(["-w", "0", "--cpu-affinity", "app:app"], environ={})
    assert any("--cpu-affinity pins worker processes and -w 0 has none" in message
               for message in ignored.check(cfg, {}, 1))
    cfg = settings.parse(["-w", "2", "--cpu-affinity", "app:app"], environ={})
    assert not ignored.check(cfg, {}, 1)
