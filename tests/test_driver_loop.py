"""The loop the master, the single-process server and the supervisor share
(forkserve.process.driver): the order of a turn, when it ends, and the stop
state kept by the hand-over.

Every test runs with os.fork forbidden: the loop and the decisions it
drives are exercised with injected fakes, no process is started.
"""

import os
import signal

import gevent
import gevent.event
import pytest

from forkserve import exits
from forkserve.config.settings import parse
from forkserve.process.actions import Stop
from forkserve.process.driver import Driver
from forkserve.process.handover import Handover
from forkserve.process.master import Master
from forkserve.process.single import SingleServer
from forkserve.process.stop_state import StopState

from driver_fakes import FakeGenerations


pytestmark = pytest.mark.usefixtures("no_fork")


def _forbidden(*args, **kwargs):
    raise AssertionError("the driver loop must not fork")


class FakeQueue:
    def __init__(self, *signums):
        self.pending = list(signums)

    def pop_all(self):
        pending, self.pending = self.pending, []
        return pending


class Recorder(Driver):
    """A driver whose steps only write down that they ran."""

    def __init__(self, *signums, children=()):
        self.steps = []
        self.queue = FakeQueue(*signums)
        self.stop_state = StopState()
        self.handover = Handover(serving=1, owner_serves=False, graceful_timeout=10.0,
                                 stop_state=self.stop_state)
        self.generations = FakeGenerations()
        self.children = list(children)   # pids the next reap() collects, one per turn
        self.clock = lambda: 0.0

    def begin(self):
        self.steps.append("begin")

    def handle_term(self):
        self.steps.append("handle_term")
        self.begin_stop("graceful")

    def begin_stop(self, mode):
        self.steps.append(f"begin_stop {mode}")
        super().begin_stop(mode)

    def reap(self):
        self.steps.append("reap")
        if self.children:
            self.children.pop(0)

    def finished(self):
        self.steps.append("finished?")
        return bool(self.stopping) and not self.children

    def decide(self):
        self.steps.append("decide")

    def wait(self):
        self.steps.append("wait")


def test_driver_loop_dispatches_signals_then_reaps_then_decides():
    driver = Recorder(signal.SIGTERM, children=[101, 102])
    assert driver.turn() is True
    assert driver.steps == ["handle_term", "begin_stop graceful", "reap", "finished?",
                            "decide"]


def test_driver_loop_ends_only_once_the_last_child_is_reaped():
    driver = Recorder(signal.SIGTERM, children=[101, 102])
    driver.loop()
    assert driver.children == []
    # stopping from the first turn: two reaps, one wait between them, no decision after
    assert driver.steps.count("reap") == 2 and driver.steps.count("wait") == 1
    assert driver.steps[-2:] == ["reap", "finished?"]


def test_driver_loop_serves_until_finished_and_returns_ok():
    driver = Recorder(signal.SIGTERM)
    assert driver.serve() == exits.OK
    assert driver.steps[:2] == ["begin", "handle_term"]


def test_driver_loop_halt_stops_every_generation_fast_and_returns_the_halts_status():
    driver = Recorder()
    driver.generations.pids.update({2: 9002, 3: 9003})

    def decide():
        raise exits.HaltServer("no generation could start", exits.WORKER_BOOT_ERROR)

    driver.decide = decide
    assert driver.serve() == exits.WORKER_BOOT_ERROR
    assert driver.generations.signalled == [(2, signal.SIGQUIT), (3, signal.SIGQUIT)]


def test_driver_loop_runs_until_a_stop_is_asked():
    driver = Recorder()
    for _ in range(3):
        assert driver.turn() is True
    driver.queue.pending.append(signal.SIGTERM)
    assert driver.turn() is False
    assert driver.stopping == "graceful"


def test_driver_loop_stops_gracefully_once_the_supervisor_is_gone():
    driver = Recorder()
    driver.parent = os.getppid() + 1_000_000  # not our parent: the supervisor died
    assert driver.turn() is False
    assert driver.steps[0] == "begin_stop graceful"
    assert driver.parent is None  # said once


def test_driver_loop_stop_state_is_the_handovers_and_a_weaker_stop_changes_nothing():
    driver = Recorder()
    driver.handover.starting = 2
    driver.generations.pids[2] = 9002
    driver.begin_stop("fast")
    assert driver.stopping == "fast"
    stopped = [(1, signal.SIGQUIT), (2, signal.SIGQUIT)]  # the serving and the starting one
    assert driver.generations.signalled == stopped
    assert driver.stop_state.under_way("graceful") and driver.stop_state.under_way("fast")
    driver.begin_stop("graceful")
    assert driver.stopping == "fast" and driver.generations.signalled == stopped


def test_driver_loop_a_graceful_stop_can_become_fast():
    handover = Handover(serving=1, owner_serves=True, graceful_timeout=10.0)
    handover.starting = 2
    assert handover.stop("graceful", 0.0) == [Stop(2, "graceful")]
    assert handover.stop_state.under_way("graceful") and not handover.stop_state.under_way("fast")
    assert handover.stop("fast", 1.0) == [Stop(2, "fast")]


# --- the master: its stop state is the hand-over's, its workers are told the same ---

@pytest.fixture
def master():
    cfg = parse(["-w", "2", "--graceful-timeout", "10", "a:b"], environ={}, cwd="/")
    killed = []
    master = Master(cfg, app=None, listeners=[], app_name="a:b", fork=_forbidden,
                    waitpid=lambda pid, options: (0, 0), kill=lambda *a: killed.append(a),
                    clock=lambda: 100.0)
    master.generations = FakeGenerations()
    master.killed = killed
    yield master
    master.queue.close()
    master.scoreboard.close()


def test_driver_loop_master_stops_through_the_handover_and_its_workers_follow(master):
    master.lifecycle.forked(0, 4001, 1, 1)  # a worker, as if forked
    master.queue.push(signal.SIGTERM)
    assert master.turn() is True  # a worker is left to reap
    assert master.handover.stopping == "graceful" and master.stopping == "graceful"
    assert master.killed == [(4001, signal.SIGTERM)]
    assert not master.serving()
    master.queue.push(signal.SIGTERM)  # a second TERM: nothing more
    master.queue.push(signal.SIGINT)   # INT: the workers get QUIT
    master.turn()
    assert master.stopping == "fast"
    assert master.killed == [(4001, signal.SIGTERM), (4001, signal.SIGQUIT)]
    del master.lifecycle.workers[4001]  # reaped
    assert master.turn() is False


def test_driver_loop_master_lifecycle_and_handover_share_one_stop_state(master):
    master.handover.stop("fast", 100.0)  # however the stop is taken, the workers' view follows
    assert master.lifecycle.stopping == "fast" and master.stopping == "fast"


def test_driver_loop_master_halting_is_read_from_its_stop_state(master):
    master.lifecycle.forked(0, 4001, 1, 1)
    master.apply(master.lifecycle.halt())
    assert master.stop_state.halting and master.killed == [(4001, signal.SIGKILL)]
    # the workers are killed as in a fast stop; the hand-over is not stopped (Driver.halt is)
    assert master.lifecycle.stopping == "fast" and master.handover.stopping is None


# --- the stop state (forkserve.process.stop_state) ---

def test_stop_state_only_gets_faster():
    state = StopState()
    assert state.ask("graceful") and state.mode == "graceful"
    assert not state.ask("graceful")  # a second TERM
    assert state.ask("fast") and state.mode == "fast"  # INT after TERM
    assert not state.ask("graceful") and state.mode == "fast"  # TERM after INT


def test_stop_state_takes_no_stop_once_handed_over():
    state = StopState()
    state.handed_over = True
    assert not state.ask("fast") and state.mode is None


# --- the single server: the same loop, waiting on its gevent hub ---

@pytest.fixture
def single():
    cfg = parse(["-w", "0", "--graceful-timeout", "10", "a:b"], environ={}, cwd="/")
    exits = []

    def waitpid(pid, options):
        for exited in exits:
            if exited[0] == pid:
                exits.remove(exited)
                return exited
        return 0, 0

    single = SingleServer(cfg, app=None, listeners=[], app_name="a:b", waitpid=waitpid,
                          clock=lambda: 100.0)
    single.generations = FakeGenerations()
    single.exits = exits
    yield single
    single.queue.close()


def test_driver_loop_single_server_keeps_its_stop_state_in_the_handover(single):
    single.queue.push(signal.SIGINT)
    assert single.turn() is False  # the loop ends; run() closes the servers
    assert single.handover.stopping == "fast" and single.stopping == "fast"
    assert not single.serving()


def test_driver_loop_single_server_hands_a_hup_to_the_handover(single):
    single.queue.push(signal.SIGHUP)
    assert single.turn() is True
    assert single.generations.spawned == [2] and single.handover.starting == 2
    single.queue.push(signal.SIGHUP)  # during the reload: once it is over
    single.turn()
    assert single.generations.spawned == [2] and single.handover.reload_again


def test_driver_loop_single_server_ends_when_the_handover_retires_it(single, monkeypatch):
    retired = []
    monkeypatch.setattr(single.hooks, "pre_retire", retired.append)
    single.queue.push(signal.SIGHUP)
    single.turn()
    single.generations.ready.append(2)  # generation 2 serves
    assert single.turn() is True  # this turn's decision retires this process
    assert retired == [1] and single.draining
    single.exits.append((9002, 0))  # the new generation's exit waits for the drain
    assert single.turn() is False
    assert single.generations.pids == {2: 9002}
    assert single.handover.stopping is None  # drained, not stopped: run() hands over


def test_driver_loop_single_server_signal_wakes_its_wait_on_the_hub(single):
    gevent.spawn(single.queue.push, signal.SIGUSR1)
    single.pause(60.0)  # the hub runs the push, which wakes the wait
    assert single.queue.pop_all() == [signal.SIGUSR1]


def test_driver_loop_single_server_dispatches_signals_while_it_drains(single, monkeypatch):
    drained = gevent.event.Event()
    handled = []

    class Server:
        def drain(self, timeout):
            drained.wait(60.0)  # in-flight requests: until the signal was handled

    def handle_usr1():
        handled.append(signal.SIGUSR1)
        drained.set()

    monkeypatch.setattr(single, "handle_usr1", handle_usr1)
    gevent.spawn(single.queue.push, signal.SIGUSR1)
    single.drain([Server()])
    assert handled == [signal.SIGUSR1]
