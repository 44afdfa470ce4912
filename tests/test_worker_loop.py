"""A worker's loop (forkserve.process.worker.Worker, a forkserve.process.driver.Loop),
turned in this process with its clock injected: no fork, no signal sent."""

import os
import select
import signal
import time

import pytest

from forkserve.config.settings import parse
from forkserve.memory import cow
from forkserve.process.scoreboard import Scoreboard
from forkserve.process.signals import SignalQueue
from forkserve.process import worker as worker_module
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


# --- callbacks of the worker's event loop: none may switch (issue 49) ---

@pytest.fixture
def hub_errors(monkeypatch):
    """What the gevent hub reports failing in its callbacks (a
    BlockingSwitchOutError from a timer's callback would land here)."""
    import gevent
    errors = []
    hub = gevent.get_hub()
    monkeypatch.setattr(hub, "handle_error",
                        lambda context, kind, value, tb: errors.append((context, value)))
    return errors


@pytest.fixture
def serving_worker(worker):
    """The worker with a real server on a listening socket, and a wake pipe
    standing for its master's."""
    import socket

    from forkserve.http.server import Server
    from forkserve.process.gevent_servers import gevent_socket
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    server = Server(gevent_socket(listener), app=None)
    server.start()
    worker.servers = [server]
    master = SignalQueue()
    worker.wake_master = master.wake_w
    worker._wake_pipe = worker_module._identity(master.wake_w)  # as init_process() reads it
    worker.master = master
    yield worker
    server.close_now()
    listener.close()
    master.close()


class Limit:
    """A MemoryLimit whose reading is set by the test."""

    def __init__(self):
        self.private = None
        self.checks = 0

    def over(self):
        self.checks += 1
        return self.private


def _run_delayed_memory_check(worker, hub_errors, limit):
    """A response within the check gap arms the delayed check (a loop
    timer); let the loop run its callback."""
    import gevent
    worker.memory_limit = limit
    worker.clock = time.monotonic
    worker._next_memory_check = worker.clock() + worker.memory_check_gap
    worker._count_and_check()
    assert worker._memory_timer is not None  # armed: the check runs in the timer's callback
    deadline = worker.clock() + 10
    while worker._memory_timer is not None and worker.clock() < deadline:
        gevent.sleep(0.001)
    assert worker._memory_timer is None, "the delayed memory check never ran"
    assert hub_errors == [], hub_errors


def test_the_delayed_memory_check_finding_retire_already_set_switches_nothing(
        serving_worker, hub_errors):
    # issue 49: the master flagged the worker RETIRE inside the gap; the
    # timer's callback retired it and stop_accepting() switched: the hub
    # raised BlockingSwitchOutError and the worker kept accepting.
    from forkserve.process.scoreboard import RETIRE
    worker = serving_worker
    worker.scoreboard.set_state(worker.index, RETIRE)
    limit = Limit()
    _run_delayed_memory_check(worker, hub_errors, limit)
    assert worker.retiring and limit.checks == 0
    assert worker.scoreboard.read(worker.index).state == RETIRE
    assert not worker.servers[0].closed  # it serves on until its replacement does


def test_the_delayed_memory_check_over_the_limit_asks_and_wakes_the_master(
        serving_worker, hub_errors):
    from forkserve.process.scoreboard import RETIRE
    worker = serving_worker
    worker.cfg = worker.cfg.with_values(max_worker_memory=200)
    limit = Limit()
    limit.private = 300 * 2**20
    _run_delayed_memory_check(worker, hub_errors, limit)
    assert worker.retiring and limit.checks == 1
    assert worker.scoreboard.read(worker.index).state == RETIRE
    assert select.select([worker.master.wake_r], [], [], 0)[0]  # the master's loop wakes
    assert not worker.servers[0].closed


def test_reaching_max_requests_asks_once_and_wakes_the_master(serving_worker, hub_errors):
    from forkserve.process.scoreboard import RETIRE
    worker = serving_worker
    worker.max_requests = 3
    for _ in range(5):
        worker._count_and_check()
    assert worker.requests == 5 and worker.retiring
    assert worker.scoreboard.read(worker.index).state == RETIRE
    assert select.select([worker.master.wake_r], [], [], 0)[0]
    assert not worker.servers[0].closed and hub_errors == []


def test_a_term_from_the_hubs_signal_watcher_stops_and_drains_the_worker_switching_nothing(
        serving_worker, hub_errors):
    # the signal watcher only enqueues (its handler runs in a greenlet of its
    # own); the loop's turn stops, and the drain runs in the worker's greenlet
    import gevent
    worker = serving_worker
    watcher = gevent.signal_handler(signal.SIGTERM, worker.queue.push, signal.SIGTERM)
    try:
        signal.raise_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        while not worker.queue.pending and time.monotonic() < deadline:
            gevent.sleep(0.001)
    finally:
        watcher.cancel()
    assert worker.queue.pending == [signal.SIGTERM] and not worker.servers[0].closed
    assert worker.turn() is False and worker.stopping == "graceful"
    import gevent.select
    worker._select = gevent.select.select  # as after fork: the hub runs while it waits
    worker.drain(worker.servers)
    assert worker.servers[0].closed and hub_errors == []


def test_a_wake_pipe_the_application_closed_and_reused_gets_no_byte(serving_worker):
    worker = serving_worker
    read_end, write_end = os.pipe()
    # e.g. a post_fork hook closing every descriptor, then opening its own
    os.dup2(write_end, worker.master.wake_w)  # the master's pipe closed, the number reused
    try:
        worker.max_requests = 1
        worker._count_and_check()
        assert worker.retiring and worker.wake_master is None
        os.set_blocking(read_end, False)
        with pytest.raises(BlockingIOError):
            os.read(read_end, 1)  # nothing was written into it
    finally:
        os.close(read_end)
        os.close(write_end)
