"""--cpu-affinity's choice of CPU (forkserve.process.affinity), without
pinning anything: the kernel calls are passed in."""

import errno
import logging

import pytest

from forkserve.config import ignored, settings, values
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


def test_auto_pins_only_while_workers_outnumber_the_cpus():
    two = {0, 1}
    assert [affinity.choose("auto", n, 4, two) for n in (1, 2, 3, 4)] == [0, 1, 0, 1]
    assert affinity.choose("auto", 3, 3, two) == 0
    assert affinity.choose("auto", 1, 2, two) is None  # as many workers as CPUs
    assert affinity.choose("auto", 1, 1, two) is None
    assert affinity.choose("on", 2, 2, two) == 1
    assert affinity.choose("on", 1, 1, two) == 0
    assert affinity.choose("off", 1, 8, two) is None


def test_pin_sets_the_cpu():
    calls = []
    assert affinity.pin(4, 6, setaffinity=lambda pid, cpus: calls.append((pid, cpus))) == 6
    assert calls == [(0, {6})]


def test_a_refused_pin_is_a_warning_and_the_worker_runs_on(caplog):
    def refuse(pid, cpus):
        raise OSError(errno.EINVAL, "Invalid argument")
    with caplog.at_level(logging.WARNING, logger="forkserve.error"):
        assert affinity.pin(2, 1, setaffinity=refuse) is None
    assert "worker 2: --cpu-affinity could not pin it to CPU 1 (Invalid argument)" in caplog.text


def test_the_setting_is_auto_by_default_and_takes_on_off_or_a_config_files_bool():
    assert settings.parse(["app:app"], environ={}).cpu_affinity == "auto"
    assert settings.parse(["--cpu-affinity", "ON", "app:app"], environ={}).cpu_affinity == "on"
    assert settings.parse(["app:app"], environ={"FORKSERVE_CPU_AFFINITY": "off"}) \
        .cpu_affinity == "off"
    assert values.cpu_affinity(True) == "on" and values.cpu_affinity(False) == "off"
    with pytest.raises(settings.ConfigError, match="expected auto, on or off; got 'yes please'"):
        settings.parse(["--cpu-affinity", "yes please", "app:app"], environ={})


def test_on_is_moot_with_w0_and_auto_is_not():
    cfg = settings.parse(["-w", "0", "--cpu-affinity", "on", "app:app"], environ={})
    assert any("--cpu-affinity pins worker processes and -w 0 has none" in message
               for message in ignored.check(cfg, {}, 1))
    assert not ignored.check(settings.parse(["-w", "0", "app:app"], environ={}), {}, 1)
    cfg = settings.parse(["-w", "2", "--cpu-affinity", "on", "app:app"], environ={})
    assert not ignored.check(cfg, {}, 1)
