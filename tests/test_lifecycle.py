"""The workers' lifecycle (forkserve.process.lifecycle): pure decisions, no process.

Every test runs with os.fork forbidden: the state machine must decide
without forking, signalling or reading a clock of its own.
"""

import logging
import signal

import pytest

from forkserve import exits
from forkserve.process.actions import Announce, Fork, Halt, Kill
from forkserve.process.lifecycle import Lifecycle

KILLED = exits.classify(signal.SIGKILL)                       # a raw status: killed by a signal
BOOT_ERROR = exits.classify(exits.WORKER_BOOT_ERROR << 8)
OUT_OF_FDS = exits.classify(exits.WORKER_RESOURCE_ERROR << 8)
CRASHED = exits.classify(exits.FAILURE << 8)


pytestmark = pytest.mark.usefixtures("no_fork")


def machine(target=2, **kwargs):
    kwargs.setdefault("timeout", 30.0)
    kwargs.setdefault("graceful_timeout", 10.0)
    return Lifecycle(target, **kwargs)


def start(lifecycle, now=0.0, first_pid=100):
    """Carry out the Forks of one tick: pids first_pid, first_pid + 1, ..."""
    forks = [a for a in lifecycle.tick(now) if a == Fork()]
    used = {r.index for r in lifecycle.workers.values()}
    pids = []
    for n in range(len(forks)):
        index = min(set(range(64)) - used)
        used.add(index)
        lifecycle.forked(index, first_pid + n, generation=1)
        pids.append(first_pid + n)
    return pids


def ready(lifecycle, now=0.0):
    for pid in list(lifecycle.workers):
        lifecycle.observed(pid, now, beat=now, said_ready=True)


def kinds(actions):
    return [type(a).__name__ for a in actions]


def test_lifecycle_forks_up_to_the_target_and_announces_once_all_are_ready():
    lifecycle = machine(target=3)
    assert lifecycle.tick(0.0) == [Fork(), Fork(), Fork()]
    for n in range(3):
        lifecycle.forked(n, 100 + n, generation=1)
    assert lifecycle.tick(0.1) == []  # booting ones count towards the target
    ready(lifecycle)
    assert lifecycle.tick(0.2) == [Announce()]
    assert lifecycle.tick(0.3) == []  # once


def test_lifecycle_worker_killed_before_ready_is_replaced_after_a_doubling_backoff_forever():
    lifecycle = machine(target=1)
    pid = start(lifecycle)[0]
    now, delays = 0.0, []
    for attempt in range(12):  # far more than max_boot_failures
        actions = lifecycle.exited(pid, KILLED if attempt % 2 else OUT_OF_FDS, now)
        assert kinds(actions) == ["Log"] and actions[0].level == logging.ERROR
        delays.append(lifecycle.next_spawn_at - now)
        assert lifecycle.tick(now) == []                       # not before the backoff
        now = lifecycle.next_spawn_at
        pid = start(lifecycle, now, first_pid=200 + attempt)[0]  # then one fork
    assert delays[:4] == pytest.approx([0.1, 0.2, 0.4, 0.8])
    assert max(delays) == pytest.approx(Lifecycle.max_backoff) == pytest.approx(delays[-1])
    assert "was killed by SIGKILL before it was ready" in str(
        lifecycle.exited(pid, KILLED, now)[0].message)


def test_lifecycle_backoff_stays_at_its_cap_after_thousands_of_early_exits():
    # Workers killed as they start for hours (the OOM killer) must not
    # overflow the doubling: 2 ** 1024 x 0.1 s is past a float.
    lifecycle = machine(target=1)
    pid = start(lifecycle)[0]
    now = 0.0
    for attempt in range(1100):
        lifecycle.exited(pid, KILLED, now)
        now = lifecycle.next_spawn_at
        pid = start(lifecycle, now, first_pid=1000 + attempt)[0]
    lifecycle.exited(pid, KILLED, now)
    assert lifecycle.next_spawn_at - now == pytest.approx(Lifecycle.max_backoff)


def test_lifecycle_a_failed_fork_waits_the_longest_backoff_before_the_next():
    lifecycle = machine(target=1)
    actions = lifecycle.fork_failed(5.0, "Cannot allocate memory")
    assert kinds(actions) == ["Log"] and "could not fork a worker" in actions[0].message
    assert lifecycle.tick(5.0) == []
    assert lifecycle.tick(5.0 + Lifecycle.max_backoff) == [Fork()]


def test_lifecycle_halts_after_five_boot_failures_in_a_row_quoting_the_last_error():
    lifecycle = machine(target=1)
    now = 0.0
    for attempt in range(Lifecycle.max_boot_failures):
        pid = start(lifecycle, now, first_pid=100 + attempt)[0]
        actions = lifecycle.exited(pid, BOOT_ERROR, now, error=f"KeyError: 'DB_URL' ({attempt})")
        now = lifecycle.next_spawn_at
    assert actions[-1] == Halt("workers failed to boot 5 times in a row; the last one's "
                               "error: KeyError: 'DB_URL' (4)")
    assert Halt not in [type(a) for a in actions[:-1]]


def test_lifecycle_a_worker_ready_resets_the_boot_failures_and_the_backoff():
    lifecycle = machine(target=1)
    now = 0.0
    for attempt in range(Lifecycle.max_boot_failures - 1):
        pid = start(lifecycle, now, first_pid=100 + attempt)[0]
        lifecycle.exited(pid, BOOT_ERROR, now)
        now = lifecycle.next_spawn_at
    pid = start(lifecycle, now, first_pid=300)[0]
    lifecycle.observed(pid, now, beat=now, said_ready=True)
    assert (lifecycle.boot_failures, lifecycle.early_exits) == (0, 0)
    actions = lifecycle.exited(pid, BOOT_ERROR, now, said_ready=True)
    assert kinds(actions) == ["Log"]  # it had served: replaced at once, no backoff
    assert lifecycle.tick(now) == [Fork()]


def test_lifecycle_counts_a_worker_ready_from_its_slot_read_after_it_exited():
    lifecycle = machine(target=1)
    pid = start(lifecycle)[0]
    # it said it serves, then crashed before any turn of the loop read its slot
    actions = lifecycle.exited(pid, CRASHED, 0.0, said_ready=True)
    assert "starting a replacement" in actions[0].message and lifecycle.early_exits == 0
    assert lifecycle.tick(0.0) == [Fork()]


def test_lifecycle_replaces_a_worker_that_asked_to_retire_before_stopping_it():
    lifecycle = machine(target=1)
    old = start(lifecycle)[0]
    ready(lifecycle)
    lifecycle.tick(0.0)
    ask(lifecycle, old, 1.0)
    assert kinds(lifecycle.tick(1.0)) == ["Log", "Fork"]  # the replacement first
    lifecycle.forked(1, 101, generation=1)
    assert lifecycle.tick(1.1) == []  # the old one serves until the new one does
    lifecycle.observed(101, 1.2, beat=1.2, said_ready=True)
    actions = lifecycle.tick(1.2)
    assert kinds(actions) == ["Log", "Kill"] and actions[-1] == Kill(old, signal.SIGTERM)
    assert lifecycle.workers[old].deadline == pytest.approx(1.2 + 10.0 + 1.0)


def serving(target):
    """A lifecycle whose `target` workers serve; it and their pids."""
    lifecycle = machine(target=target)
    pids = start(lifecycle)
    ready(lifecycle)
    lifecycle.tick(0.0)
    return lifecycle, pids


def ask(lifecycle, pid, now):
    """Worker `pid`'s slot read at `now` says it asks to be recycled."""
    lifecycle.observed(pid, now, beat=now, said_ready=True, asked_retire=True)


def recycle_round(lifecycle, now, pid):
    """One tick; carry out its Fork as pid `pid`; what it decided."""
    actions = lifecycle.tick(now)
    if Fork() in actions:
        used = {r.index for r in lifecycle.workers.values()}
        number = lifecycle.free_number()
        lifecycle.forked(min(set(range(64)) - used), pid, generation=1, number=number)
    return actions


def accepting(lifecycle):
    """Workers that accept: ready ones, and retiring ones (they serve until replaced)."""
    return sum(1 for r in lifecycle.workers.values()
               if r.ready and r.state in ("ready", "retiring"))


def test_lifecycle_workers_asking_together_are_recycled_one_after_the_other():
    lifecycle, pids = serving(3)
    for pid in pids:  # all reach --max-requests in the same turn
        ask(lifecycle, pid, 1.0)
    now, new_pid, stopped = 1.0, 200, []
    for _ in range(3):
        actions = recycle_round(lifecycle, now, new_pid)
        assert actions.count(Fork()) == 1  # one replacement at a time
        assert sum(r.state == "retiring" for r in lifecycle.workers.values()) == 1
        assert recycle_round(lifecycle, now + 0.01, 999) == []  # nothing more while it boots
        assert accepting(lifecycle) == 3  # none of the three out of service meanwhile
        lifecycle.observed(new_pid, now + 0.02, beat=now + 0.02, said_ready=True)
        stopped += [a.pid for a in lifecycle.tick(now + 0.02) if type(a) is Kill]
        now += Lifecycle.recycle_interval
        new_pid += 1
    # in the order they asked, each once its replacement served
    assert stopped == pids
    assert sorted(r.number for r in lifecycle.workers.values()
                  if r.state == "ready") == [1, 2, 3]
    assert recycle_round(lifecycle, now + 1, 999) == []


def test_lifecycle_a_replacement_slow_to_boot_holds_up_the_next_recycle_only_so_long():
    lifecycle, (first, second) = serving(2)
    ask(lifecycle, first, 1.0)
    ask(lifecycle, second, 1.0)
    assert recycle_round(lifecycle, 1.0, 200).count(Fork()) == 1
    bound = 1.0 + Lifecycle.recycle_overlap
    assert recycle_round(lifecycle, bound - 0.01, 999) == []  # the new one still boots
    actions = recycle_round(lifecycle, bound, 201)
    assert actions.count(Fork()) == 1 and "has not said it serves within 5s" in actions[0].message
    assert lifecycle.workers[second].state == "retiring"


def test_lifecycle_two_recycles_start_at_least_the_recycle_interval_apart():
    # sustained load at a low --max-requests: replacements that boot at once
    # do not let the recycles take the CPU; the next one waits its interval
    lifecycle, (first, second) = serving(2)
    assert lifecycle.next_recycle_at() is None  # nothing queued: no wake-up
    ask(lifecycle, first, 1.0)
    ask(lifecycle, second, 1.0)
    assert lifecycle.next_recycle_at() == 0.0  # the first starts at once
    assert recycle_round(lifecycle, 1.0, 200).count(Fork()) == 1
    lifecycle.observed(200, 1.01, beat=1.01, said_ready=True)
    assert Kill(first, signal.SIGTERM) in lifecycle.tick(1.01)
    due = 1.1  # 0.1 s after the first started (docs/reloads.md)
    assert lifecycle.next_recycle_at() == pytest.approx(due)  # when the master wakes
    assert recycle_round(lifecycle, 1.05, 999) == []  # second serves on meanwhile
    assert lifecycle.workers[second].state == "ready"
    assert recycle_round(lifecycle, due, 201).count(Fork()) == 1
    assert lifecycle.workers[second].state == "retiring"
    assert lifecycle.next_recycle_at() is None


def test_lifecycle_a_retiring_worker_serves_on_while_another_is_missing():
    # worker 1 is replaced, but worker 2 died meanwhile: worker 1 stays until
    # the workers without it are back to the target
    lifecycle, (first, second) = serving(2)
    ask(lifecycle, first, 1.0)
    recycle_round(lifecycle, 1.0, 200)
    lifecycle.observed(200, 1.1, beat=1.1, said_ready=True)
    lifecycle.exited(second, KILLED, 1.05)
    assert recycle_round(lifecycle, 1.1, 201) == [Fork()]  # worker 2's replacement; 1 stays
    lifecycle.observed(201, 1.2, beat=1.2, said_ready=True)
    assert Kill(first, signal.SIGTERM) in lifecycle.tick(1.2)


def test_lifecycle_jittered_requests_recycle_as_they_come():
    # --max-requests-jitter: the workers ask at different times, each is
    # replaced at once, as nobody else is being replaced
    lifecycle, (first, second) = serving(2)
    ask(lifecycle, first, 1.0)
    assert Fork() in recycle_round(lifecycle, 1.0, 200)
    lifecycle.observed(200, 1.1, beat=1.1, said_ready=True)
    assert Kill(first, signal.SIGTERM) in lifecycle.tick(1.1)
    ask(lifecycle, second, 2.0)
    assert Fork() in recycle_round(lifecycle, 2.0, 201)


def test_lifecycle_kills_a_worker_whose_beat_is_older_than_the_timeout():
    lifecycle = machine(target=1, timeout=5.0)
    pid = start(lifecycle)[0]
    ready(lifecycle)
    assert lifecycle.observed(pid, 4.0, beat=0.0) == []
    actions = lifecycle.observed(pid, 6.0, beat=0.0)
    assert kinds(actions) == ["Log", "Kill"] and actions[-1] == Kill(pid, signal.SIGKILL)
    assert lifecycle.tick(6.0) == [Fork()]  # a stopping worker no longer counts


def test_lifecycle_sends_abort_first_when_a_worker_abort_hook_is_installed():
    lifecycle = machine(target=1, timeout=5.0, abort_first=True)
    pid = start(lifecycle)[0]
    assert lifecycle.observed(pid, 6.0, beat=0.0)[-1] == Kill(pid, signal.SIGABRT)
    assert lifecycle.observed(pid, 7.5, beat=0.0)[-1] == Kill(pid, signal.SIGKILL)


def test_lifecycle_graceful_stop_then_sigkill_after_the_deadline_and_exits_are_expected():
    lifecycle = machine(target=2)
    pids = start(lifecycle)
    assert lifecycle.stop("graceful", 0.0) == [Kill(p, signal.SIGTERM) for p in pids]
    assert lifecycle.stop("graceful", 1.0) is None  # already under way
    assert lifecycle.tick(5.0) == []
    assert lifecycle.tick(10.5) == [Kill(p, signal.SIGKILL) for p in pids]
    actions = lifecycle.exited(pids[0], KILLED, 10.6)
    assert kinds(actions) == ["Log"] and actions[0].level == logging.INFO
    assert lifecycle.stop("fast", 11.0) == [Kill(pids[1], signal.SIGQUIT)]  # fast wins


def test_lifecycle_more_workers_than_the_target_stops_the_highest_slots():
    lifecycle = machine(target=3)
    pids = start(lifecycle)
    ready(lifecycle)
    assert lifecycle.tick(0.5) == [Announce()]
    lifecycle.target = 1  # TTOU twice
    assert sorted(lifecycle.tick(1.0), key=lambda a: a.pid) == [
        Kill(pids[1], signal.SIGTERM), Kill(pids[2], signal.SIGTERM)]


def test_lifecycle_draining_for_a_new_generation_replaces_none():
    lifecycle = machine(target=2)
    pids = start(lifecycle)
    ready(lifecycle)
    assert lifecycle.drain(1.0) == [Kill(p, signal.SIGTERM) for p in pids]
    lifecycle.exited(pids[0], KILLED, 1.5)
    assert lifecycle.tick(2.0, replace=False) == []
    assert kinds(lifecycle.kill_draining(generation=1)) == ["Log", "Kill"]
    assert lifecycle.kill_draining(generation=1) == []  # each one once


def test_lifecycle_a_worker_found_over_memory_is_queued_once():
    lifecycle = machine(target=2)
    pids = start(lifecycle)
    ready(lifecycle)
    assert not lifecycle.asked(pids[0])
    lifecycle.retire(pids[0], 1.0)  # --max-worker-memory
    lifecycle.retire(pids[0], 2.0)
    assert lifecycle.asked(pids[0]) and lifecycle.workers[pids[0]].asked_at == 1.0


def test_lifecycle_hup_under_a_supervisor_replaces_every_worker_in_turn():
    lifecycle = machine(target=2)
    start(lifecycle)
    ready(lifecycle)
    lifecycle.tick(0.0)
    lifecycle.retire_all(1.0)
    assert recycle_round(lifecycle, 1.0, 200).count(Fork()) == 1


def test_lifecycle_ignores_the_exit_of_a_process_that_is_not_a_worker():
    assert machine().exited(4242, KILLED, 0.0) is None
