"""The CPU turns (on by default, --no-yield-cpu turns them off): a process
that serves calls sched_yield() before its event loop polls, at most once
per cpu_turns.TURN of its time (forkserve.process.cpu_turns), so processes
sharing a CPU take turns per batch of requests rather than per scheduler
tick. What that does to latency benchmarks/throughput.py measures
(forkserve against forkserve-noyield); here, that the call is made where
it is on and not where it is off."""

import shutil
import signal
import subprocess

import gevent
import pytest

from forkserve.config import settings
from forkserve.process.cpu_turns import take_turns
from forkserve.process.gevent_servers import cpu_turns_for
from forkserve_testing import missing


def test_the_loop_yields_before_it_polls_and_never_keeps_itself_running():
    calls = []
    watcher = take_turns(gevent.get_hub().loop, lambda: calls.append(1), turn=0)
    try:
        assert watcher.active and not watcher.ref  # an idle loop may still exit
        for turn in range(1, 4):
            # a sleep may end in the turn of the loop it began in (resumed from
            # that turn's callbacks): the second begins in a turn of its own
            gevent.sleep(0.001)
            gevent.sleep(0.001)
            assert len(calls) >= turn
    finally:
        watcher.stop()
    before = len(calls)
    gevent.sleep(0.001)
    assert len(calls) == before


def test_it_yields_at_most_once_a_turn_of_time():
    loop = gevent.get_hub().loop
    calls = []
    watcher = take_turns(loop, lambda: calls.append(loop.now()), turn=0.05)
    try:
        started = loop.now()
        while loop.now() - started < 0.2:
            gevent.sleep(0.001)  # many turns of the loop, each well under `turn`
    finally:
        watcher.stop()
    assert 2 <= len(calls) <= 5, calls  # about one per 0.05 s of the 0.2 s, not one per turn
    assert all(b - a >= 0.05 for a, b in zip(calls, calls[1:])), calls


def test_what_is_held_is_written_before_the_yield():
    order = []
    watcher = take_turns(gevent.get_hub().loop, lambda: order.append("yield"), turn=0,
                         before_yield=lambda: order.append("write"))
    try:
        gevent.sleep(0.001)
        gevent.sleep(0.001)
    finally:
        watcher.stop()
    assert order[:2] == ["write", "yield"] and order == ["write", "yield"] * (len(order) // 2)


def test_it_is_on_unless_turned_off():
    assert settings.parse(["app:app"], environ={}).yield_cpu is True
    assert settings.parse(["--no-yield-cpu", "app:app"], environ={}).yield_cpu is False
    assert settings.parse(["app:app"], environ={"FORKSERVE_YIELD_CPU": "0"}).yield_cpu is False


def test_a_process_takes_turns_unless_turned_off_and_writes_its_outbox_before_each():
    class Outbox:
        writes = 0

        def write_held(self):
            self.writes += 1

    outbox = Outbox()
    assert cpu_turns_for(settings.parse(["--no-yield-cpu", "app:app"], environ={}), outbox) is None
    watcher = cpu_turns_for(settings.parse(["app:app"], environ={}), outbox)
    try:
        for _ in range(3):
            gevent.sleep(0.002)  # each poll comes a turn (0.5 ms) after the last
    finally:
        watcher.stop()
    assert outbox.writes >= 2
    # without an Outbox (--no-batch-responses) it only yields
    watcher = cpu_turns_for(settings.parse(["app:app"], environ={}), None)
    try:
        gevent.sleep(0.002)
        gevent.sleep(0.002)
    finally:
        watcher.stop()


def traced(pid, requests):
    """The sched_yield() and write() calls process `pid` makes while
    `requests` runs, as strace sees them (a write is a response: it shows
    strace saw the requests)."""
    trace = subprocess.Popen(["strace", "-e", "trace=sched_yield,write", "-p", str(pid)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        first = trace.stderr.readline()  # "strace: Process PID attached", or why it could not
        assert "attached" in first, first
        requests()
    finally:
        trace.send_signal(signal.SIGINT)
        _, err = trace.communicate(timeout=10)
    return err.count("sched_yield("), err.count("write(")


def need_strace():
    """Skip on a machine without strace; fail in CI (CI=true), where .ci/run installs it."""
    if shutil.which("strace") is None:
        missing(pytest, "strace is missing: apt-get install strace (.ci/run installs it)")


@pytest.mark.e2e
@pytest.mark.parametrize("workers", ["1", "0"])
@pytest.mark.parametrize("args, yields", [((), True), (("--no-yield-cpu",), False)])
def test_a_serving_process_yields_the_cpu_unless_turned_off(run_server, workers, args, yields):
    need_strace()
    server = run_server("-w", workers, *args)
    pid = server.wait_workers(1)[0] if workers == "1" else server.pid

    def requests():  # each a few turns of the loop; together more than a TURN
        for _ in range(10):
            assert server.get("/pid")[0] == 200
    yields_seen, writes = traced(pid, requests)
    assert writes >= 10, "strace did not see the server's responses"
    assert (yields_seen > 0) == yields, (yields_seen, writes)
