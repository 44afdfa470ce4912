"""The reload/hand-over state machine and the master's loop, without processes.

forkserve.process.handover is pure: events in, actions out. The master is
driven with fork, waitpid, kill and the clock injected (as gunicorn's arbiter
tests mock os.fork), its generations replaced by a fake that records.
"""

import errno
import logging
import os
import signal

import pytest

from forkserve import exits
from forkserve.config.settings import parse
from forkserve.process import actions as action_types, generation_protocol, handover, systemd
from forkserve.process.actions import (BecomeSupervisor, ForceOut, Forward, Halt, Log, Notify,
                                       Retire, Spawn, Stop)
from forkserve.process.generations import Generations
from forkserve.process.handover import Handover
from forkserve.process.lifecycle import Lifecycle
from forkserve.process.master import Master
from forkserve.process.scoreboard import FREE, READY, RETIRE
from forkserve.process.signals import MASTER_SIGNALS
from forkserve.process.supervisor import Supervisor

from driver_fakes import FakeGenerations


def _kinds(actions, *types):
    """The actions other than log lines (or only those of `types`)."""
    types = types or tuple(getattr(action_types, name) for name in action_types.__all__
                           if name != "Log")
    return [a for a in actions if isinstance(a, types)]


def _owner(**kwargs):
    return Handover(serving=1, graceful_timeout=10, owner_serves=True, **kwargs)


def _supervisor(**kwargs):
    return Handover(serving=3, graceful_timeout=10, owner_serves=False, **kwargs)


# --- the state machine ---

def test_reload_hup_starts_the_next_generation_and_tells_systemd():
    machine = _owner()
    assert _kinds(machine.hup(now=0)) == [Notify("RELOADING=1"), Spawn(2)]
    assert machine.state == handover.STARTING


def test_reload_old_generation_retires_only_once_the_new_one_is_ready():
    machine = _owner()
    machine.hup(now=0)
    assert _kinds(machine.tick(now=100)) == []  # no deadline while the new one starts
    assert _kinds(machine.ready(now=5)) == [Retire(1)]
    assert (machine.serving, machine.retiring, machine.state) == (2, 1, handover.RETIRING)


def test_reload_master_becomes_the_supervisor_once_its_workers_drained():
    machine = _owner()
    machine.hup(now=0)
    machine.ready(now=1)
    assert _kinds(machine.gone(1, "drained", now=2)) == [BecomeSupervisor(2, False)]


def test_reload_supervisor_tells_systemd_ready_once_the_old_generation_is_gone():
    machine = _supervisor()
    machine.hup(now=0)
    assert _kinds(machine.ready(now=1)) == [Retire(3)]
    assert _kinds(machine.gone(3, "exited cleanly", now=2)) == [Notify("READY=1")]
    assert (machine.serving, machine.state) == (4, handover.IDLE)


@pytest.mark.parametrize("phase", ["starting", "retiring"])
def test_reload_hup_during_reload_reloads_again_once_done(phase):
    machine = _supervisor()
    machine.hup(now=0)
    if phase == "retiring":
        machine.ready(now=1)
    assert _kinds(machine.hup(now=2)) == []  # remembered, no third generation
    if phase == "starting":
        assert _kinds(machine.ready(now=3)) == [Retire(3)]
    assert _kinds(machine.gone(3, "exited cleanly", now=4)) == [
        Notify("READY=1"), Notify("RELOADING=1"), Spawn(5)]
    assert _kinds(machine.hup(now=5)) == []  # a third HUP waits for that one in turn


def test_reload_hup_during_the_masters_reload_is_handed_to_the_supervisor():
    machine = _owner()
    machine.hup(now=0)
    machine.hup(now=1)
    machine.ready(now=2)
    assert _kinds(machine.gone(1, "drained", now=3)) == [BecomeSupervisor(2, True)]
    supervisor = Handover(serving=2, graceful_timeout=10, owner_serves=False,
                          reload_again=True)
    assert _kinds(supervisor.begin(now=4)) == [Notify("RELOADING=1"), Spawn(3)]


@pytest.mark.parametrize("mode, signum", [("graceful", "TERM"), ("fast", "QUIT")])
def test_reload_stop_during_reload_stops_the_starting_generation(mode, signum):
    machine = _owner()
    machine.hup(now=0)
    machine.hup(now=1)
    assert _kinds(machine.stop(mode, now=2)) == [Stop(2, mode)]
    assert _kinds(machine.ready(now=3)) == []  # never retires, never hands over
    assert _kinds(machine.gone(2, "exited cleanly", now=4)) == []
    assert _kinds(machine.hup(now=5)) == []
    assert machine.state == handover.STOPPING


def test_reload_term_while_the_old_generation_drains_stops_the_new_one_and_never_hands_over():
    machine = _owner()
    machine.hup(now=0)
    machine.ready(now=1)
    assert _kinds(machine.stop("graceful", now=2)) == [Stop(2, "graceful")]
    assert _kinds(machine.gone(1, "drained", now=3)) == []


def test_reload_supervisor_term_during_reload_stops_every_generation():
    machine = _supervisor()
    machine.hup(now=0)
    assert sorted(_kinds(machine.stop("graceful", now=1)), key=lambda a: a.number) == [
        Stop(3, "graceful"), Stop(4, "graceful")]
    assert _kinds(machine.stop("graceful", now=2)) == []  # a second TERM changes nothing
    assert len(_kinds(machine.stop("fast", now=3))) == 2  # but INT after TERM goes faster


def test_reload_new_generation_dying_before_ready_keeps_the_old_one_serving():
    machine = _owner()
    machine.hup(now=0)
    actions = machine.gone(2, "could not load the application", now=1)
    assert _kinds(actions) == [Notify("READY=1")]  # the reload is over
    assert "Reload failed" in actions[0].message
    assert "the previous generation keeps serving" in actions[0].message
    assert (machine.serving, machine.state) == (1, handover.IDLE)
    assert _kinds(machine.hup(now=2)) == [Notify("RELOADING=1"), Spawn(3)]  # can try again


def test_reload_hup_during_a_reload_that_fails_tries_once_more():
    machine = _owner()
    machine.hup(now=0)
    machine.hup(now=1)  # e.g. the fixed code, sent while the broken one loads
    assert _kinds(machine.gone(2, "failed", now=2)) == [Notify("READY=1"),
                                                        Notify("RELOADING=1"), Spawn(3)]


def test_reload_old_generation_that_does_not_leave_within_the_graceful_timeout_is_killed():
    machine = _owner()
    machine.hup(now=0)
    machine.ready(now=100)
    assert _kinds(machine.tick(now=110.9)) == []
    assert _kinds(machine.tick(now=111.1)) == [ForceOut(1)]
    assert _kinds(machine.tick(now=111.1 + handover.KILL_GRACE - 0.1)) == []
    # a generation whose loop is blocked ignores the fast stop: SIGKILL follows
    assert _kinds(machine.tick(now=111.2 + handover.KILL_GRACE)) == [ForceOut(1, hard=True)]
    assert _kinds(machine.tick(now=500)) == []  # nothing stronger: waited for
    assert _kinds(machine.gone(1, "drained", now=501)) == [BecomeSupervisor(2, False)]


@pytest.mark.parametrize("mode, grace", [("graceful", 11.0), ("fast", 1.0)])
def test_reload_generations_that_do_not_stop_are_stopped_fast_then_killed(mode, grace):
    machine = _supervisor()
    machine.hup(now=0)
    machine.stop(mode, now=10)
    assert _kinds(machine.tick(now=10 + grace - 0.1)) == []
    assert _kinds(machine.tick(now=10.1 + grace)) == [ForceOut(3), ForceOut(4)]
    machine.gone(3, "exited cleanly", now=10.2 + grace)
    assert _kinds(machine.tick(now=10.3 + grace + handover.KILL_GRACE)) == [
        ForceOut(4, hard=True)]
    assert _kinds(machine.tick(now=1000)) == []


def test_reload_a_generation_stuck_loading_is_forced_out_and_a_queued_hup_goes_on():
    machine = _owner(start_timeout=60)
    machine.hup(now=0)
    machine.hup(now=1)  # queued behind the generation that never says it serves
    assert _kinds(machine.tick(now=59.9)) == []
    actions = machine.tick(now=60.1)
    assert _kinds(actions) == [ForceOut(2)]
    assert "did not say it serves within 60s" in actions[0].message
    assert _kinds(machine.tick(now=60.2 + handover.KILL_GRACE)) == [ForceOut(2, hard=True)]
    assert _kinds(machine.gone(2, "was killed by SIGKILL", now=66)) == [
        Notify("READY=1"), Notify("RELOADING=1"), Spawn(3)]
    assert _kinds(machine.tick(now=125)) == []  # generation 3 has its own 60 s
    assert _kinds(machine.ready(now=126)) == [Retire(1)]
    assert _kinds(machine.tick(now=1000)) == [ForceOut(1)]  # only the drain's deadline is left


def test_reload_a_fast_stop_after_a_graceful_one_forces_out_sooner():
    machine = _supervisor()
    machine.stop("graceful", now=0)
    machine.stop("fast", now=2)
    assert _kinds(machine.tick(now=3.1)) == [ForceOut(3)]


def test_reload_new_generation_dying_after_ready_lets_the_master_serve_again():
    machine = _owner()
    machine.hup(now=0)
    machine.ready(now=1)
    actions = machine.gone(2, "was killed by SIGKILL", now=2)
    assert _kinds(actions) == []
    assert "generation 1 serves again" in actions[0].message
    assert (machine.serving, machine.retiring, machine.state) == (1, None, handover.IDLE)


def test_reload_new_generation_dying_after_ready_makes_the_supervisor_start_another():
    machine = _supervisor()
    machine.hup(now=0)
    machine.ready(now=1)
    assert _kinds(machine.gone(4, "was killed by SIGKILL", now=2)) == [Spawn(5)]
    # no READY=1 while no generation serves (5 is still starting)
    assert _kinds(machine.gone(3, "exited cleanly", now=3)) == []
    assert _kinds(machine.ready(now=4)) == [Notify("READY=1")]  # nothing left to retire
    assert machine.serving == 5


def test_reload_supervisor_replaces_a_serving_generation_that_dies_and_gives_up_after_five():
    machine = _supervisor()
    assert _kinds(machine.gone(3, "was killed by SIGKILL", now=0)) == [Spawn(4)]
    for number in (4, 5, 6, 7):
        assert _kinds(machine.gone(number, "failed", now=1)) == [Spawn(number + 1)]
    assert _kinds(machine.gone(8, "failed", now=2)) == [
        Halt("no generation could start; see the errors above")]


def test_reload_is_not_started_while_stopping():
    machine = _supervisor()
    machine.stop("graceful", now=0)
    assert _kinds(machine.hup(now=1)) == []
    assert _kinds(machine.gone(3, "exited cleanly", now=2)) == []


# --- the master's loop, with fork, waitpid, kill and the clock injected ---

class FakeOs:
    def __init__(self):
        self.next_pid = 1000
        self.forked = []
        self.killed = []
        self.exits = []       # (pid, status) for waitpid to report
        self.now = 1000.0  # the scoreboard's heartbeats too (Master gives it this clock)

    def fork(self):
        self.next_pid += 1
        self.forked.append(self.next_pid)
        return self.next_pid

    def waitpid(self, pid, options):
        return self.exits.pop(0) if self.exits else (0, 0)

    def kill(self, pid, signum):
        self.killed.append((pid, signum))

    def clock(self):
        return self.now


@pytest.fixture
def master():
    cfg = parse(["-w", "2", "--graceful-timeout", "10", "--timeout", "30", "a:b"],
                environ={}, cwd="/")
    fake = FakeOs()
    master = Master(cfg, app=None, listeners=[], app_name="a:b", fork=fake.fork,
                    waitpid=fake.waitpid, kill=fake.kill, clock=fake.clock)
    master.generations = FakeGenerations()
    master.handed_over = []

    def exec_supervisor(action):  # the real one never returns
        master.handed_over.append(action)
        raise Execed

    master.become_supervisor = exec_supervisor
    master.fake = fake
    yield master
    master.queue.close()
    master.scoreboard.close()


class Execed(Exception):
    pass


def _turn(master):
    """One turn of Master.run's loop, minus the sleep."""
    master.turn()


def _make_ready(master):
    for record in master.workers.values():
        master.scoreboard.set_state(record.index, READY)
    _turn(master)


def _hup_into_a_starting_generation(master):
    _turn(master)
    _make_ready(master)
    master.queue.push(signal.SIGHUP)
    _turn(master)


def _hup_until_the_new_generation_serves(master):
    _hup_into_a_starting_generation(master)
    master.generations.ready.append(2)
    _turn(master)


def _exit(master, pid, status=0):
    master.fake.exits.append((pid, status))


def test_master_forks_workers_up_to_the_target_and_replaces_one_that_dies(master):
    _turn(master)
    first = list(master.fake.forked)
    assert len(first) == 2
    _make_ready(master)
    _exit(master, first[0], signal.SIGKILL)  # a raw status: killed by SIGKILL
    _turn(master)
    assert first[0] not in master.workers
    assert len(master.fake.forked) == 3 and len(master.workers) == 2


def test_master_kills_a_worker_whose_heartbeat_is_older_than_the_timeout(master):
    _turn(master)
    _make_ready(master)
    master.fake.now = master.scoreboard.read(0).beat + 31
    stuck = [r.pid for r in master.workers.values() if r.index == 0][0]
    master.murder()
    assert (stuck, signal.SIGKILL) in master.fake.killed


def test_master_boot_failures_back_off_then_halt(master):
    _turn(master)
    for attempt in range(Lifecycle.max_boot_failures):
        pid = master.fake.forked[-1]
        _exit(master, pid, exits.WORKER_BOOT_ERROR << 8)
        if attempt == Lifecycle.max_boot_failures - 1:
            with pytest.raises(exits.HaltServer):
                master.reap()
            return
        master.reap()
        forks = len(master.fake.forked)
        master.manage()
        assert len(master.fake.forked) == forks  # not before the backoff delay
        master.fake.now = master.lifecycle.next_spawn_at
        master.manage()
        assert len(master.fake.forked) == forks + 1


def test_master_replaces_workers_killed_before_ready_with_a_growing_backoff_and_never_halts(
        master):
    _turn(master)
    delays = []
    for _ in range(Lifecycle.max_boot_failures + 1):  # 12 exits, each of two kinds
        for status in (signal.SIGKILL, exits.WORKER_RESOURCE_ERROR << 8):
            forks = len(master.fake.forked)
            _exit(master, master.fake.forked[-1], status)
            _turn(master)  # no HaltServer
            assert len(master.fake.forked) == forks  # not before the backoff delay
            delays.append(master.lifecycle.next_spawn_at - master.fake.now)
            master.fake.now = master.lifecycle.next_spawn_at
            _turn(master)
            assert len(master.fake.forked) == forks + 1
    assert delays[:3] == pytest.approx([Lifecycle.boot_backoff * 2 ** n for n in range(3)])
    assert max(delays) == pytest.approx(delays[-1]) == pytest.approx(Lifecycle.max_backoff)


def test_master_counts_a_worker_ready_once_it_says_so_even_if_it_dies_before_the_next_turn(
        master):
    _turn(master)
    pid = master.fake.forked[-1]
    record = master.workers[pid]
    master.scoreboard.set_state(record.index, READY)
    _exit(master, pid, exits.WORKER_BOOT_ERROR << 8)  # e.g. a crash on its first request
    _turn(master)
    assert master.lifecycle.boot_failures == 0 and master.lifecycle.next_spawn_at <= master.fake.now


def test_master_halt_after_boot_failures_quotes_the_workers_error(master):
    _turn(master)
    for _ in range(Lifecycle.max_boot_failures - 1):
        master.boot_errors.write(master.workers[master.fake.forked[-1]].index, "first")
        _exit(master, master.fake.forked[-1], exits.WORKER_BOOT_ERROR << 8)
        master.reap()
        master.fake.now = master.lifecycle.next_spawn_at
        master.manage()
    last = master.workers[master.fake.forked[-1]]
    master.boot_errors.write(last.index, "ImportError: No module named 'redis'")
    _exit(master, last.pid, exits.WORKER_BOOT_ERROR << 8)
    with pytest.raises(exits.HaltServer) as halt:
        master.reap()
    assert halt.value.reason == ("workers failed to boot 5 times in a row; the last one's "
                                 "error: ImportError: No module named 'redis'")


def _retire_worker_1(master):
    """Start two workers and have worker 1 reach --max-requests; its record."""
    _turn(master)
    _make_ready(master)
    [old] = [r for r in master.workers.values() if r.number == 1]
    master.scoreboard.set_state(old.index, RETIRE)
    _turn(master)
    return old


def test_master_recycles_replacement_first_the_old_worker_leaves_once_the_new_is_ready(master):
    old = _retire_worker_1(master)
    assert len(master.fake.forked) == 3  # the replacement first
    assert (old.pid, signal.SIGTERM) not in master.fake.killed  # the old one still serves
    _make_ready(master)
    assert (old.pid, signal.SIGTERM) in master.fake.killed


def test_a_recycled_workers_replacement_takes_its_number_in_another_scoreboard_slot(master):
    old = _retire_worker_1(master)
    [new] = [r for r in master.workers.values() if r.pid == master.fake.forked[-1]]
    assert (new.number, new.worker_id) == (1, 1) and new.index not in (0, 1)
    _make_ready(master)
    _exit(master, old.pid)
    _turn(master)
    assert sorted(r.number for r in master.workers.values()) == [1, 2]
    assert sorted(info.worker_id for info in master.process_infos()[1:]) == [1, 2]


def test_reload_master_hup_drains_its_workers_only_once_the_new_generation_serves(master):
    _turn(master)
    _make_ready(master)
    master.queue.push(signal.SIGHUP)
    _turn(master)
    assert master.generations.spawned == [2]
    assert not [k for k in master.fake.killed if k[1] == signal.SIGTERM]
    master.generations.ready.append(2)
    _turn(master)
    assert sorted(k[0] for k in master.fake.killed if k[1] == signal.SIGTERM) == sorted(
        master.workers)
    for pid in list(master.workers):
        _exit(master, pid)
    with pytest.raises(Execed):
        _turn(master)
    assert master.handed_over == [BecomeSupervisor(2, False)]


def test_reload_master_does_not_replace_a_worker_that_dies_during_the_handover(master):
    _hup_until_the_new_generation_serves(master)
    forks = len(master.fake.forked)
    first, second = sorted(master.workers)
    _exit(master, first, signal.SIGKILL)
    _turn(master)
    assert len(master.fake.forked) == forks and master.handed_over == []
    _exit(master, second)
    with pytest.raises(Execed):
        _turn(master)
    assert len(master.fake.forked) == forks and master.handed_over == [BecomeSupervisor(2, False)]


def test_reload_master_replaces_a_worker_that_dies_while_the_new_generation_starts(master):
    _turn(master)
    _make_ready(master)
    master.queue.push(signal.SIGHUP)
    _turn(master)
    _exit(master, sorted(master.workers)[0], signal.SIGKILL)
    _turn(master)
    assert len(master.fake.forked) == 3


def test_reload_master_kills_workers_that_outstay_the_graceful_timeout(master):
    _hup_until_the_new_generation_serves(master)
    master.fake.now += 11.5
    _turn(master)
    assert sorted(k[0] for k in master.fake.killed if k[1] == signal.SIGKILL) == sorted(
        master.workers)


def test_reload_master_serves_again_when_the_new_generation_dies_after_ready(
        master, monkeypatch):
    from forkserve.process import procname
    titles = []
    monkeypatch.setattr(procname, "set_title",
                        lambda cfg, role, app, detail="": titles.append((role, detail)))
    _hup_until_the_new_generation_serves(master)
    assert titles[-1] == ("master", "serving generation 2")
    forks = len(master.fake.forked)
    _exit(master, master.generations.pid(2), signal.SIGKILL)
    _turn(master)
    assert len(master.fake.forked) == forks + 2  # fresh workers from the data it holds
    # `forkserve memory --pid` must not label the fresh workers as draining
    assert titles[-1] == ("master", "")
    for pid in [pid for pid, r in master.workers.items() if r.state == "stopping"]:
        _exit(master, pid)
    _turn(master)
    assert master.handed_over == []


def test_reload_master_term_during_reload_stops_the_new_generation_and_exits(master):
    _turn(master)
    _make_ready(master)
    master.queue.push(signal.SIGHUP)
    _turn(master)
    master.queue.push(signal.SIGTERM)
    _turn(master)
    assert master.generations.signalled == [(2, signal.SIGTERM)]
    for pid in list(master.workers):
        _exit(master, pid)
    _exit(master, master.generations.pid(2))
    _turn(master)
    assert not master.workers and not master.generations.pids and master.handed_over == []


def test_reload_master_kills_a_retired_worker_that_stays_after_the_new_generation_died(
        master):
    _hup_until_the_new_generation_serves(master)
    retired = sorted(master.workers)
    _exit(master, master.generations.pid(2), signal.SIGKILL)
    _turn(master)  # generation 1 serves again: the hand-over's deadline is gone
    master.fake.now += 11.5
    _turn(master)
    assert sorted(k[0] for k in master.fake.killed if k[1] == signal.SIGKILL) == retired


def test_reload_workers_close_the_ready_pipes(master):
    master.generations.waiting_fds = lambda: [41]  # a generation starting: its read end
    master.role = generation_protocol.Role(generation=3, ready_fd=42)  # this master is a generation
    assert {41, 42} <= set(master.master_fds())
    master.lifecycle.announced = True  # signal_ready() wrote and closed 42: the number is free
    assert 42 not in master.master_fds()


def test_reload_a_fork_that_fails_is_a_failed_reload_and_leaks_no_descriptor(master, caplog):
    def fork():
        raise OSError(errno.EAGAIN, "Resource temporarily unavailable")

    _turn(master)
    _make_ready(master)
    master.generations = Generations([], ["python"], fork=fork, kill=master.fake.kill)
    open_before = len(os.listdir("/proc/self/fd"))
    master.queue.push(signal.SIGHUP)
    _turn(master)  # the master goes on
    assert len(os.listdir("/proc/self/fd")) == open_before
    assert (master.handover.serving, master.handover.state) == (1, handover.IDLE)
    assert "Reload failed: generation 2 could not be started (fork: " in caplog.text
    assert not [k for k in master.fake.killed if k[1] == signal.SIGTERM]  # workers serve on


def test_reload_a_generation_forced_out_hard_takes_its_workers_with_it():
    killed = []
    generations = Generations([], ["python"], kill=lambda pid, signum: killed.append(
        (pid, signum)), children=lambda pid: {700: [701, 702]}[pid])
    generations.pids[2] = 700
    generations.force_out(2)
    assert killed == [(700, signal.SIGQUIT)]  # its master stops its own workers
    generations.force_out(2, hard=True)  # it did not: its loop is blocked, theirs may be
    assert killed[1:] == [(700, signal.SIGKILL), (701, signal.SIGKILL), (702, signal.SIGKILL)]


# --- the supervisor, driven the same way ---

@pytest.fixture
def supervisor(monkeypatch):
    notified = []
    monkeypatch.setattr(systemd, "notify", lambda *states: notified.extend(states))
    cfg = parse(["-w", "2", "--graceful-timeout", "10", "a:b"], environ={}, cwd="/")
    state = {"app": cfg.app, "values": cfg.values, "app_name": "a:b", "argv": ["python"],
             "start_directory": "/", "fds": [], "stats_fd": None, "child": 500,
             "generation": 2}
    fake = FakeOs()
    supervisor = Supervisor(state, fork=fake.fork, waitpid=fake.waitpid, kill=fake.kill,
                            clock=fake.clock)
    generations = FakeGenerations()
    generations.pids = dict(supervisor.generations.pids)  # generation 2 is pid 500
    supervisor.generations = generations
    supervisor.fake, supervisor.notified = fake, notified
    yield supervisor
    supervisor.queue.close()


def test_reload_supervisor_starts_generations_where_the_master_started():
    cfg = parse(["a:b"], environ={}, cwd="/")
    state = {"app": cfg.app, "values": cfg.values, "app_name": "a:b", "argv": ["python"],
             "start_directory": "/srv/where-the-master-started", "fds": [], "stats_fd": None,
             "child": 500, "generation": 2}
    ours = generation_protocol.START_DIRECTORY
    supervisor = Supervisor(state)
    supervisor.queue.close()
    assert supervisor.generations.directory == "/srv/where-the-master-started"
    assert generation_protocol.START_DIRECTORY == ours  # no module global rewritten


def _supervisor_turn(supervisor):
    supervisor.turn()


def test_reload_supervisor_retires_the_old_generation_once_the_new_one_serves(supervisor):
    supervisor.queue.push(signal.SIGHUP)
    _supervisor_turn(supervisor)
    assert supervisor.generations.spawned == [3] and supervisor.notified == ["RELOADING=1"]
    supervisor.generations.ready.append(3)
    _supervisor_turn(supervisor)
    assert supervisor.generations.signalled == [(2, signal.SIGTERM)]
    supervisor.fake.exits.append((500, 0))
    _supervisor_turn(supervisor)
    assert supervisor.notified == ["RELOADING=1", "READY=1"]


def test_reload_supervisor_stops_an_old_generation_that_outstays_the_graceful_timeout(
        supervisor):
    supervisor.queue.push(signal.SIGUSR2)  # as HUP
    _supervisor_turn(supervisor)
    supervisor.generations.ready.append(3)
    _supervisor_turn(supervisor)
    supervisor.fake.now += 11.5
    _supervisor_turn(supervisor)
    # QUIT, not KILL: the old generation's master then kills its own workers
    assert supervisor.generations.signalled[-1] == (2, signal.SIGQUIT)
    supervisor.fake.now += handover.KILL_GRACE + 0.1
    _supervisor_turn(supervisor)
    # ... unless its loop is blocked: then SIGKILL (its workers leave with it)
    assert supervisor.generations.signalled[-1] == (2, signal.SIGKILL)


def test_reload_supervisor_term_during_a_reload_stops_both_generations(supervisor):
    supervisor.queue.push(signal.SIGHUP)
    supervisor.queue.push(signal.SIGTERM)
    _supervisor_turn(supervisor)
    assert sorted(supervisor.generations.signalled) == [(2, signal.SIGTERM),
                                                        (3, signal.SIGTERM)]
    assert supervisor.notified == ["RELOADING=1", "STOPPING=1"]


def test_master_forks_a_worker_with_the_servers_signals_blocked(master):
    # A TERM sent to a worker between the fork and its own handlers must wait
    # for them, not run the master's handler in the child and be lost.
    masks = []
    fork = master.fake.fork

    def recording_fork():
        masks.append(signal.pthread_sigmask(signal.SIG_BLOCK, []))
        return fork()

    master._fork = recording_fork
    master.spawn_worker()
    assert masks and set(MASTER_SIGNALS) <= masks[0]
    assert not set(MASTER_SIGNALS) & signal.pthread_sigmask(signal.SIG_BLOCK, [])


def test_master_accounts_for_every_exited_worker_before_a_raising_child_exit_halts(master):
    from forkserve.exits import HaltServer
    from forkserve.process.hooks import Hooks

    def child_exit(server, worker):  # a config's child_exit hook that raises
        raise ValueError("no metrics server")

    master.hooks = Hooks({"child_exit": child_exit}, master.cfg)
    _turn(master)
    _make_ready(master)
    for pid in list(master.workers):
        _exit(master, pid, signal.SIGKILL)
    with pytest.raises(HaltServer):
        master.reap()
    assert master.workers == {}  # both reaped, neither left for a halt to wait on
    _turn(master)  # forks two again (nothing stops this test's loop)
    master.stop_state.halting = True  # the halt's cleanup reaps: a raising hook halts no more
    for pid in list(master.workers):
        _exit(master, pid)
    master.reap()
    assert master.workers == {}


def test_master_keeps_serving_when_a_worker_fork_fails_for_lack_of_memory(master, caplog):
    # Under memory or process-limit pressure fork() fails with ENOMEM or
    # EAGAIN: the master logs it and tries again after the backoff, as it
    # does for a generation, instead of dying with a traceback.
    _turn(master)
    _make_ready(master)
    fork = master.fake.fork
    failing = [True]

    def fork_once_out_of_memory():
        if failing:
            failing.clear()
            raise OSError(errno.ENOMEM, "Cannot allocate memory")
        return fork()

    master._fork = fork_once_out_of_memory
    victim = next(iter(master.workers))
    _exit(master, victim, signal.SIGKILL)
    with caplog.at_level(logging.ERROR, logger="forkserve.error"):
        _turn(master)  # reaps, tries to replace: the fork fails
    assert "could not fork a worker (Cannot allocate memory)" in caplog.text
    assert len(master.workers) == 1
    assert all(master.scoreboard.read(i).state == FREE for i in range(2)
               if i not in {r.index for r in master.workers.values()})
    master.fake.now = master.lifecycle.next_spawn_at
    _turn(master)
    assert len(master.workers) == 2


# --- TTIN/TTOU during a reload: for the incoming generation (issue 33 item 5) ---

TTIN, TTOU = signal.SIGTTIN, signal.SIGTTOU


def test_resize_while_idle_goes_to_the_owners_own_workers_at_once():
    machine = _owner()
    assert _kinds(machine.resize(1, now=0)) == [Forward(1, TTIN)]
    assert _kinds(machine.resize(-1, now=0)) == [Forward(1, TTOU)]


def test_resize_while_a_generation_starts_is_kept_for_it_and_forwarded_one_at_a_time():
    machine = _supervisor()
    machine.hup(now=0)
    for now in (1, 2, 3, 4):
        assert _kinds(machine.resize(1, now=now)) == []  # not to generation 3, which leaves
    [said] = machine.resize(-1, now=5)
    assert said.message == "TTOU during a reload: generation 4 gets 3 workers more once it serves"
    actions = machine.ready(now=10)
    assert _kinds(actions, Forward) == [Forward(4, TTIN)]
    assert any("gets the 3 workers more asked for during the reload" in a.message
               for a in actions if isinstance(a, Log))
    assert _kinds(machine.tick(now=10 + handover.FORWARD_PACE / 2), Forward) == []
    assert machine.forward_wait(now=10.1) == pytest.approx(handover.FORWARD_PACE - 0.1)
    sent = []
    now = 10.0
    while machine.forward_wait(now) is not None:
        now += handover.FORWARD_PACE
        sent += _kinds(machine.tick(now=now), Forward)
    assert sent == [Forward(4, TTIN)] * 2
    # it serves now: straight to it, paced after the last one
    assert _kinds(machine.resize(-1, now=now + handover.FORWARD_PACE)) == [
        Forward(4, TTOU)]


def test_resize_while_the_old_generation_drains_goes_to_the_new_one():
    machine = _supervisor()
    machine.hup(now=0)
    machine.ready(now=1)
    assert _kinds(machine.resize(1, now=2)) == [Forward(4, TTIN)]


def test_resize_during_a_failed_reload_goes_to_the_generation_that_keeps_serving():
    machine = _supervisor()
    machine.hup(now=0)
    machine.resize(-1, now=1)
    actions = machine.gone(4, "exited with status 4", now=2)
    assert _kinds(actions, Forward) == [Forward(3, TTOU)]


def test_resize_during_the_masters_reload_is_handed_to_its_supervisor():
    machine = _owner()
    machine.hup(now=0)
    machine.resize(1, now=1)
    machine.resize(1, now=1.1)
    assert _kinds(machine.ready(now=2), Forward) == [Forward(2, TTIN)]
    assert _kinds(machine.gone(1, "drained", now=2.01)) == [BecomeSupervisor(2, False, 1)]
    supervisor = Handover(serving=2, graceful_timeout=10, owner_serves=False, workers=1)
    assert _kinds(supervisor.tick(now=5)) == [Forward(2, TTIN)]
    assert supervisor.forward_wait(now=5) is None


def test_resize_during_a_stop_is_ignored_and_a_stop_drops_what_was_pending():
    machine = _supervisor()
    machine.hup(now=0)
    machine.resize(1, now=1)
    machine.stop("graceful", now=2)
    assert _kinds(machine.ready(now=3)) == [] and machine.forward_wait(now=3) is None
    assert machine.resize(1, now=4)[0].message == "TTIN ignored: stopping"


def test_reload_master_applies_ttin_during_a_reload_to_the_new_generation_not_its_own(master):
    _hup_into_a_starting_generation(master)
    master.queue.push(signal.SIGTTIN)
    _turn(master)
    assert master.target == 2 and master.generations.signalled == []
    master.generations.ready.append(2)
    _turn(master)
    assert master.target == 2 and master.generations.signalled == [(2, TTIN)]
    master.queue.push(signal.SIGTTOU)
    _turn(master)  # while its own workers drain: for generation 2, paced
    master.fake.now += handover.FORWARD_PACE
    _turn(master)
    assert master.target == 2 and master.generations.signalled == [(2, TTIN), (2, TTOU)]


def test_master_ttin_while_idle_adds_a_worker_of_its_own(master):
    _turn(master)
    master.queue.push(signal.SIGTTIN)
    _turn(master)
    assert master.target == 3 and master.generations.signalled == []



def test_master_logs_ttou_down_to_one_worker_in_the_singular(master, caplog):
    _turn(master)
    master.queue.push(signal.SIGTTOU)
    with caplog.at_level(logging.INFO, logger="forkserve.error"):
        _turn(master)
    assert "TTOU: 1 worker" in caplog.messages and master.target == 1


def test_a_memory_recycle_the_master_decides_is_logged_once_not_again_by_the_worker(
        master, monkeypatch, caplog):
    import types
    from forkserve.process import master as master_module
    from forkserve.process.worker import Worker
    master.cfg = master.cfg.with_values(max_worker_memory=200)
    _turn(master)
    _make_ready(master)
    [leaky] = [r for r in master.workers.values() if r.number == 1]
    over = types.SimpleNamespace(private=int(200.4 * 2**20))
    under = types.SimpleNamespace(private=int(50 * 2**20))
    monkeypatch.setattr(master_module.procfs, "read_process",
                        lambda pid: over if pid == leaky.pid else under)
    with caplog.at_level(logging.INFO, logger="forkserve.error"):
        master.check_worker_memory()
        master.check_worker_memory()  # queued already: not found over again
    assert master.lifecycle.asked(leaky.pid)
    assert master.scoreboard.read(leaky.index).state == RETIRE
    # the worker's own check after its next response: nothing more to say or ask
    worker = types.SimpleNamespace(
        scoreboard=master.scoreboard, index=leaky.index, memory_check_gap=1.0, retiring=False,
        memory_limit=types.SimpleNamespace(over=lambda: int(206.0 * 2**20)),
        cfg=master.cfg, worker_id=leaky.number, _retire=lambda: pytest.fail("asked twice"))
    with caplog.at_level(logging.INFO, logger="forkserve.error"):
        Worker._check_memory(worker, now=0.0)
    assert worker.retiring
    assert sum("over --max-worker-memory" in m for m in caplog.messages) == 1, caplog.messages


def test_master_wakes_for_the_next_queued_recycle_when_its_interval_is_up(master):
    # Both workers ask together; the second recycle waits recycle_interval
    # after the first started, and the master's wait ends then, not a
    # heartbeat later (1 s with --timeout 30).
    _turn(master)
    _make_ready(master)
    for record in master.workers.values():
        master.scoreboard.set_state(record.index, RETIRE)
    _turn(master)
    forks = len(master.fake.forked)
    [new] = [r for r in master.workers.values() if r.state == "booting"]
    master.scoreboard.set_state(new.index, READY)
    master.fake.now += 0.01
    _turn(master)  # the replacement serves: its worker drains; the second waits
    assert len(master.fake.forked) == forks
    wait = master.next_turn_in()
    assert wait == pytest.approx(Lifecycle.recycle_interval - 0.01)
    master.fake.now += wait
    _turn(master)
    assert len(master.fake.forked) == forks + 1


def test_master_wakes_at_once_when_a_worker_asks_to_be_recycled_and_forks_its_replacement(
        master, monkeypatch):
    # A recycle waits for no heartbeat: the worker's ask (its slot, then a
    # byte on the master's wake pipe) ends the master's wait, however long
    # that wait was to be, and the turn after it forks the replacement.
    import select as select_module
    from forkserve.process import worker as worker_module
    from forkserve.process.worker import Worker
    _turn(master)
    _make_ready(master)
    [old] = [r for r in master.workers.values() if r.number == 1]
    worker = Worker(old.index, app=None, listeners=[], cfg=master.cfg,
                    scoreboard=master.scoreboard, app_name="a:b", number=1,
                    wake_master=master.queue.wake_w)  # what spawn_worker gives it
    worker._wake_pipe = worker_module._identity(master.queue.wake_w)  # as after fork
    worker.max_requests = 1
    monkeypatch.setattr(master, "next_turn_in", lambda: 3600.0)
    waits = []

    def select(readable, writable, errors, timeout):
        waits.append(timeout)
        ready = select_module.select(readable, writable, errors, 0)
        assert ready[0], "nothing woke the master: it would have slept an hour"
        return ready

    master._select = select
    worker._count_and_check()  # its 1st request: --max-requests 1 reached
    master.wait()
    forks = len(master.fake.forked)
    _turn(master)
    assert waits == [3600.0] and len(master.fake.forked) == forks + 1
    assert master.workers[old.pid].state == "retiring"
