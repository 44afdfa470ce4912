"""A worker's loop (forkserve.process.worker.Worker, a forkserve.process.driver.Loop),
turned in this process with its clock injected: no fork, no signal sent."""

import os
import select
import signal

import pytest

from forkserve.config.settings import parse
from forkserve.memory import cow
from forkserve.process.scoreboard import Scoreboard
from forkserve.process.signals import SignalQueue
from forkserve.process.worker import Worker

pytestmark = pytest.mark.usefixtures("no_fork")


class FakeGC:
    def __init__(self):
        self.ticks = []

    def tick(self, requests):
        self.ticks.append(requests)


@pytest.fixture
def worker(monkeypatch):
    monkeypatch.setattr(cow, "check", lambda: False)  # the test runner's gc is not a worker's
    cfg = parse(["-w", "1", "--timeout", "30", "a:b"], environ={}, cwd="/")
    scoreboard = Scoreboard(capacity=4)
    worker = Worker(0, app=None, listeners=[], cfg=cfg, scoreboard=scoreboard, app_name="a:b")
    worker.parent = os.getppid()  # as if this process were forked from it
    # what init_process() sets up after fork
    worker.now = 0.0
    worker.clock = lambda: worker.now
    worker.queue = SignalQueue()
    worker._select = select.select
    worker.gc = FakeGC()
    worker.readings = []
    monkeypatch.setattr(worker, "_read_private_bytes",
                        lambda: worker.readings.append(worker.now) or 2**20)
    yield worker
    worker.queue.close()
    scoreboard.close()


def test_worker_reads_its_private_memory_for_the_title_once_a_title_interval(worker):
    for worker.now in (0.0, 1.0, Worker.title_interval - 0.5, Worker.title_interval,
                       Worker.title_interval + 1.0):
        assert worker.turn() is True
    assert worker.readings == [0.0, Worker.title_interval]
    assert worker.title.shown == "0 req, 1.0 MiB private"
    assert len(worker.gc.ticks) == 5  # its garbage collection is looked at every turn


def test_worker_stops_gracefully_once_its_master_is_gone(worker):
    worker.parent = os.getppid() + 1_000_000  # not our parent: the master died
    assert worker.turn() is False
    assert worker.stopping == "graceful" and worker.parent is None


def test_worker_signals_are_dispatched_from_its_loop_and_a_fast_stop_wins(worker, monkeypatch):
    interrupted = []
    monkeypatch.setattr(worker.hooks, "worker_int", interrupted.append)
    worker.queue.push(signal.SIGTERM)
    assert worker.turn() is False and worker.stopping == "graceful"
    worker.queue.push(signal.SIGQUIT)  # while it drains: the worker_int hook, and fast
    worker.dispatch_signals()
    assert interrupted == [worker] and worker.stopping == "fast"
    worker.queue.push(signal.SIGTERM)  # a TERM after it changes nothing
    worker.dispatch_signals()
    assert worker.stopping == "fast"
