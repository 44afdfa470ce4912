"""examples/deploy/rolling-reload's decisions, driven with a fake instance.

The script against real instances behind nginx is in test_deploy_nginx.py.
"""

import importlib.machinery
import importlib.util
import signal
import socket

import pytest

from deploy_cluster import DEPLOY


def _load_script():
    loader = importlib.machinery.SourceFileLoader("rolling_reload", str(DEPLOY / "rolling-reload"))
    spec = importlib.util.spec_from_loader("rolling_reload", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


script = _load_script()


def report(*processes):
    return {"processes": [{"pid": pid, "role": role, "generation": generation}
                          for pid, role, generation in processes]}


FIRST = report((10, "master", 1), (11, "worker", 1), (12, "worker", 1))
SUPERVISED = report((10, "supervisor", None), (20, "master", 2), (21, "worker", 2))


class FakeInstance:
    """Answers a scripted series of reports, one per read; records signals and time."""

    def __init__(self, *reports):
        self.reports = list(reports)
        self.signals = []
        self.now = 0.0

    def read(self, address):
        if len(self.reports) > 1:
            return self.reports.pop(0)
        return self.reports[0]

    def kill(self, pid, signum):
        self.signals.append((pid, signum))

    def sleep(self, seconds):
        self.now += seconds

    def reload(self, timeout=10.0):
        return script.reload_instance("127.0.0.1:9100", timeout, read=self.read, kill=self.kill,
                                      clock=lambda: self.now, sleep=self.sleep)


def test_progress_is_done_only_when_every_generation_is_newer():
    assert script.progress({1}, {2}, seen_new=True) == "done"
    assert script.progress({1}, {1, 2}, seen_new=True) == "wait"    # old one draining
    assert script.progress({1}, {1}, seen_new=False) == "wait"      # new one starting
    assert script.progress({1}, {1}, seen_new=True) == "failed"     # new one came and went
    assert script.progress({1}, set(), seen_new=False) == "wait"    # stats not answering


def test_the_first_reload_signals_the_master_and_waits_for_the_supervised_generation():
    instance = FakeInstance(FIRST, FIRST, FIRST, SUPERVISED)
    assert instance.reload() == 2
    assert instance.signals == [(10, signal.SIGHUP)]


def test_a_later_reload_signals_the_supervisor_and_waits_for_the_old_generation_to_drain():
    starting = report((10, "supervisor", None), (20, "master", 2), (21, "worker", 2),
                      (30, "master", 3))
    both = report((10, "supervisor", None), (20, "master", 2), (21, "worker", 2),
                  (30, "master", 3), (31, "worker", 3))
    done = report((10, "supervisor", None), (30, "master", 3), (31, "worker", 3))
    instance = FakeInstance(SUPERVISED, starting, both, done)
    assert instance.reload() == 3
    assert instance.signals == [(10, signal.SIGHUP)]


def test_a_generation_that_dies_before_serving_stops_the_rollout():
    starting = report((10, "supervisor", None), (20, "master", 2), (30, "master", 3))
    instance = FakeInstance(SUPERVISED, starting, SUPERVISED)
    with pytest.raises(script.ReloadError, match="generation 3 stopped before it served; "
                                                 "generation 2 keeps serving"):
        instance.reload()


def test_a_read_that_fails_mid_reload_is_waited_out_not_taken_for_a_failed_generation():
    # the master stops answering while it execs into the supervisor, after
    # the new generation was seen starting
    starting = report((10, "master", 1), (11, "worker", 1), (20, "master", 2))
    instance = FakeInstance(FIRST, starting, ConnectionResetError(104, "reset"), SUPERVISED)
    read = instance.read

    def read_or_fail(address):
        answer = read(address)
        if isinstance(answer, Exception):
            raise answer
        return answer
    instance.read = read_or_fail
    assert instance.reload() == 2


def test_an_instance_that_never_reloads_times_out_with_advice():
    instance = FakeInstance(FIRST)
    with pytest.raises(script.ReloadError, match="no new generation served within 5s.*--timeout"):
        instance.reload(timeout=5)


def test_a_single_process_server_is_signalled_itself():
    instance = FakeInstance(report((10, "single", 1)),
                            report((10, "supervisor", None), (20, "single", 2)))
    assert instance.reload() == 2
    assert instance.signals == [(10, signal.SIGHUP)]


def test_a_report_without_a_server_process_is_refused():
    instance = FakeInstance(report((11, "worker", 1)))
    with pytest.raises(script.ReloadError, match="is this address a forkserve --stats"):
        instance.reload()


def test_unreachable_stats_address_says_to_run_with_stats(capsys):
    with socket.socket() as bound:  # bound, not listening: connections are refused
        bound.bind(("127.0.0.1", 0))
        address = "127.0.0.1:%d" % bound.getsockname()[1]
        assert script.main(["--timeout", "1", address]) == 1
    assert f"is the instance running with --stats {address}?" in capsys.readouterr().err
