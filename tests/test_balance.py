"""The connection balance's decision and its accept-loop side, with no socket:
forkserve.process.balance against a real scoreboard, a fake select and clock.
The accept loop's waits are driven by a scripted clock and listen queue
(Looks), and its wake on a closing connection by events: no test sleeps."""

import gevent
import gevent.event
import pytest

from forkserve.process.balance import Admission, ceiling, fair_share, may_accept
from forkserve.process.scoreboard import READY, RETIRE, Scoreboard

pytestmark = pytest.mark.usefixtures("no_fork", "no_sockets")


@pytest.mark.parametrize("total, workers, share", [(0, 4, 0), (1, 4, 1), (8, 4, 2),
                                                   (9, 4, 3), (64, 4, 16), (5, 1, 5)])
def test_fair_share_is_the_total_over_the_workers_rounded_up(total, workers, share):
    assert fair_share(total, workers) == share


def test_a_worker_at_its_share_waits_for_the_others_to_catch_up():
    assert may_accept(0, [0, 0, 0])
    assert not may_accept(1, [0, 0, 0])
    assert may_accept(1, [1, 1, 1])
    assert not may_accept(2, [1, 2, 1])
    assert may_accept(1, [1, 2, 2])


def test_a_lone_worker_always_accepts():
    assert may_accept(0, []) and may_accept(999, [])


def test_the_least_loaded_worker_may_always_accept():
    for loads in ([0, 5, 9, 2], [3, 3, 3, 3], [0, 0, 0, 1], [7, 1, 1, 1], [16, 16, 15, 17]):
        least = min(range(len(loads)), key=loads.__getitem__)
        others = loads[:least] + loads[least + 1:]
        assert may_accept(loads[least], others), loads


def test_eight_connections_taken_one_at_a_time_by_the_first_allowed_end_two_each():
    loads = [0, 0, 0, 0]
    for _ in range(8):
        taker = next(i for i in range(4) if may_accept(loads[i], loads[:i] + loads[i + 1:]))
        loads[taker] += 1
    assert loads == [2, 2, 2, 2]


def test_a_worker_may_run_an_eighth_of_its_share_ahead_of_the_others():
    assert ceiling(64, 2) == 36 and ceiling(64, 4) == 18 and ceiling(8, 4) == 2
    assert may_accept(32, [28])  # 61 open with this one: share 31, ceiling 34
    assert not may_accept(37, [28])
    assert not may_accept(2, [1, 2, 1])  # below 8 a share, no slack


def test_sixty_four_connections_land_in_runs_but_no_worker_passes_the_ceiling():
    loads, takers = [0, 0], []
    for _ in range(64):
        taker = next(i for i in range(2) if may_accept(loads[i], loads[:i] + loads[i + 1:]))
        loads[taker] += 1
        takers.append(taker)
    runs = "".join(map(str, takers)).replace("01", "0 1").replace("10", "1 0").split()
    assert max(len(run) for run in runs) > 1  # not strictly in turn
    assert max(loads) <= ceiling(64, 2) and min(loads) >= 64 - ceiling(64, 2)


def test_the_scoreboard_gives_the_loads_of_the_other_accepting_workers_only():
    board = Scoreboard(capacity=16)
    try:
        for index in range(5):
            board.prepare(index)
        for index, state in ((0, READY), (1, READY), (2, RETIRE), (3, READY)):  # 4 boots
            board.set_state(index, state)
            board.set_connections(index, 10 + index, 100 + index)
        assert sorted(board.loads(exclude=0)) == [11, 13]
        board.release(3)
        assert board.loads(exclude=0) == [11]
        slot = board.read(1)
        assert (slot.connections, slot.accepted) == (11, 101)
        board.prepare(1)
        assert (board.read(1).connections, board.read(1).accepted) == (0, 0)
    finally:
        board.close()


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


class StillWaiting(Exception):
    """wait_turn looked at the listen queue once more than the script has steps."""


class Looks:
    """The listen queue a paused worker looks at, and the clock it reads, as
    a script: wait_turn's look number i (a select) happens at time
    script[i][0] on the clock, sees a pending connection if script[i][1],
    and then runs script[i][2](board), if given. A look past the script
    raises StillWaiting out of wait_turn: the worker would have waited on.
    With a zero tick, wait_turn runs here and now: no real time passes."""

    def __init__(self, clock, script):
        self.clock = clock
        self.script = list(script)
        self.timeouts = []
        self.board = None

    def __call__(self, read, write, error, timeout):
        self.timeouts.append(timeout)
        if len(self.timeouts) > len(self.script):
            raise StillWaiting(f"look {len(self.timeouts)}")
        now, pending, then = (self.script[len(self.timeouts) - 1] + (None,))[:3]
        self.clock.now = now
        if then is not None:
            then(self.board)
        return (read if pending else []), [], []


def admission_of_four(clock, select, tick=0.0):
    """Worker 0 of four READY workers on a real scoreboard."""
    board = Scoreboard(capacity=8)
    for index in range(4):
        board.prepare(index)
        board.set_state(index, READY)
    admission = Admission(board, 0, select, clock)
    admission.tick = tick
    if isinstance(select, Looks):
        select.board = board
    return board, admission


def peers_catch_up(board):
    for index in (1, 2, 3):
        board.set_connections(index, 1, 1)


def test_opened_and_closed_publish_the_open_and_accepted_counts():
    board, admission = admission_of_four(FakeClock(), select=None)
    admission.opened()
    admission.opened()
    admission.closed()
    assert (board.read(0).connections, board.read(0).accepted) == (1, 2)
    board.close()


def test_a_worker_over_its_share_waits_until_a_peer_catches_up():
    looks = Looks(FakeClock(), [(0.0, False), (1.0, False), (2.0, False, peers_catch_up)])
    # A tick that is not zero (1 ms between looks): the looks must not wait that long.
    board, admission = admission_of_four(looks.clock, looks, tick=0.001)
    admission.opened()  # 1 against 0, 0, 0: over its share
    admission.wait_turn("listener")
    assert looks.timeouts == [0, 0, 0]  # zero-timeout looks only, until the peers caught up
    board.close()


def test_a_connection_left_waiting_longer_than_the_patience_is_taken_anyway():
    patience = Admission.patience
    looks = Looks(FakeClock(), [(0.0, True), (patience / 2, True), (patience, True)])
    board, admission = admission_of_four(looks.clock, looks)  # always pending
    admission.opened()
    admission.wait_turn("listener")
    assert len(looks.timeouts) == 3  # pending, but not for long yet; then taken
    board.close()


def test_patience_counts_only_while_connections_keep_waiting():
    patience = Admission.patience
    looks = Looks(FakeClock(), [
        (0.0, True),
        (patience / 2, False),  # a peer took it
        (patience, True),  # the new one has only just been seen
        (patience * 1.5, True),
    ])
    board, admission = admission_of_four(looks.clock, looks)
    admission.opened()
    with pytest.raises(StillWaiting, match="look 5"):
        admission.wait_turn("listener")
    board.close()


def test_a_paused_worker_looks_again_as_soon_as_one_of_its_connections_ends():
    looked = gevent.event.Event()
    board, admission = admission_of_four(FakeClock(), lambda r, w, x, t: looked.set() or ([], [], []),
                                         tick=60.0)  # only its own closing can wake it in time
    admission.opened()
    admission.opened()
    peers_catch_up(board)
    waiting = gevent.spawn(admission.wait_turn, "listener")
    assert looked.wait(timeout=2)  # it looked, and now waits for its tick
    assert not waiting.dead  # 2 against 1, 1, 1
    admission.closed()
    waiting.join(timeout=2)
    assert waiting.dead and waiting.successful()
    board.close()


def test_a_worker_holding_no_connection_is_admitted_without_reading_its_peers(monkeypatch):
    assert all(may_accept(0, others) for others in ([0], [5, 0, 0], [0] * 7, [100, 100, 100]))
    board, admission = admission_of_four(FakeClock(), select=None)
    monkeypatch.setattr(board, "loads", lambda index: pytest.fail("read the peers' counts"))
    assert admission.admit("listener")
    admission.opened()
    with pytest.raises(pytest.fail.Exception):  # holding one, it must look
        admission.admit("listener")
    board.close()
