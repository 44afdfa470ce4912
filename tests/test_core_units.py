"""Pure parts of the core: app specs, addresses, exit codes, signal dispatch."""

import os
import pathlib
import signal
import socket

import pytest

from forkserve import exits
from forkserve.config import loader
from forkserve.process import sockets, systemd
from forkserve.process.generation_protocol import Role
from forkserve.process.master import Master
from forkserve.config.settings import parse
from forkserve.process.signals import (MASTER_SIGNALS, SINGLE_SIGNALS, SignalQueue,
                                      handler_name, signals_table)
from forkserve.process.single import SingleServer
from forkserve.process.supervisor import Supervisor
from forkserve.process.scoreboard import heartbeat_interval


@pytest.mark.parametrize("spec, module, attribute, call, args, kwargs", [
    ("pkg.mod", "pkg.mod", None, False, (), {}),
    ("pkg.mod:app", "pkg.mod", "app", False, (), {}),
    ("pkg.mod:obj.wsgi", "pkg.mod", "obj.wsgi", False, (), {}),
    ("mod:create_app()", "mod", "create_app", True, (), {}),
    ("mod:create_app('x', debug=True)", "mod", "create_app", True, ("x",), {"debug": True}),
])
def test_app_specs_parse(spec, module, attribute, call, args, kwargs):
    parsed = loader.parse_spec(spec)
    assert (parsed.module, parsed.attribute, parsed.is_call, parsed.args, parsed.kwargs) == (
        module, attribute, call, args, kwargs)


@pytest.mark.parametrize("spec, message", [
    ("", "no application given"),
    ("app.py:app", "is not a module name"),
    ("path/to/app:app", "is not a module name"),
    ("mod:create_app(os.environ)", "must be literals"),
    ("mod:1+2", "neither an attribute name nor a call"),
])
def test_bad_app_specs_say_what_to_write(spec, message):
    with pytest.raises(loader.AppLoadError, match=message):
        loader.parse_spec(spec)


@pytest.mark.parametrize("text, family, target", [
    ("127.0.0.1:0", socket.AF_INET, ("127.0.0.1", 0)),
    ("localhost:8000", None, None),
    ("[::1]:8080", socket.AF_INET6, ("::1", 8080)),
    ("unix:/run/app.sock", socket.AF_UNIX, "/run/app.sock"),
    ("127.0.0.1", socket.AF_INET, ("127.0.0.1", 8000)),
])
def test_bind_addresses_parse(text, family, target):
    address = sockets.parse_address(text)
    if family is not None:
        assert address.family == family and address.target == target


@pytest.mark.parametrize("text, message", [
    ("127.0.0.1:99999", "port must be a number from 0 to 65535"),
    ("127.0.0.1:http", "port must be a number"),
    ("::1:80", "put IPv6 addresses in brackets"),
    ("unix:", "has no path"),
])
def test_bad_bind_addresses_say_how_to_write_them(text, message):
    with pytest.raises(sockets.BindError, match=message):
        sockets.parse_address(text)


def test_port_zero_binds_and_describes_the_real_port():
    sock = sockets.bind(sockets.parse_address("127.0.0.1:0"))
    try:
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
        port = sock.getsockname()[1]
        assert port > 0 and sockets.describe(sock) == f"http://127.0.0.1:{port}"
    finally:
        sock.close()


def _status_of(code=None, signum=None):
    pid = os.fork()
    if pid == 0:
        if signum:
            os.kill(os.getpid(), signum)
        os._exit(code or 0)
    return os.waitpid(pid, 0)[1]


@pytest.mark.usefixtures("single_threaded")  # _status_of forks this process
@pytest.mark.parametrize("code, signum, kind", [
    (0, None, "clean"), (exits.WORKER_BOOT_ERROR, None, "boot_error"), (1, None, "error"),
    (None, signal.SIGKILL, "signal"),
])
def test_exit_statuses_are_classified(code, signum, kind):
    outcome = exits.classify(_status_of(code, signum))
    assert outcome.kind == kind
    if signum:
        assert "SIGKILL" in outcome.description


def _master(*argv):
    cfg = parse([*argv, "a:b"], environ={}, cwd="/")
    return Master(cfg, app=None, listeners=[], app_name="a:b")


def test_signals_pushed_into_the_queue_are_dispatched_in_order():
    master = _master("-w", "2")
    for signum in (signal.SIGTTIN, signal.SIGTTIN, signal.SIGTTOU):
        master.queue.push(signum)
    master.dispatch_signals()
    assert master.target == 3
    assert master.queue.pending == []


def test_ttou_never_goes_below_one_worker():
    master = _master("-w", "1")
    master.queue.push(signal.SIGTTOU)
    master.dispatch_signals()
    assert master.target == 1


def test_term_starts_a_graceful_stop_and_int_a_fast_one():
    master = _master("-w", "1", "--graceful-timeout", "7")
    master.queue.push(signal.SIGTERM)
    master.dispatch_signals()
    assert master.stopping == "graceful"
    master.queue.push(signal.SIGINT)
    master.dispatch_signals()
    assert master.stopping == "fast"


def test_signal_queue_wakes_a_sleeping_loop():
    queue = SignalQueue()
    try:
        queue.push(signal.SIGHUP)
        assert os.read(queue.wake_r, 10) == b"."
        assert queue.pop_all() == [signal.SIGHUP]
    finally:
        queue.close()


def test_heartbeat_is_frequent_enough_for_the_timeout():
    assert heartbeat_interval(1) <= 0.25
    assert heartbeat_interval(30) == 1.0
    assert heartbeat_interval(0) == 1.0


def test_the_role_is_read_once_and_the_variables_leave_the_environment():
    environ = {"FORKSERVE__FDS": "3,4", "FORKSERVE__READY_FD": "9",
               "FORKSERVE__GENERATION": "5", "PATH": "/bin"}
    role = Role.from_environ(environ)
    assert role == Role(generation=5, ready_fd=9, fds=(3, 4)) and role.supervised
    assert environ == {"PATH": "/bin"}
    assert not Role.from_environ({}).supervised and Role.from_environ({}).generation == 1


def test_the_ready_pipe_is_not_inherited_by_the_applications_subprocesses():
    read_end, write_end = os.pipe()
    os.set_inheritable(write_end, True)  # as spawn_generation passes it through exec
    try:
        role = Role.from_environ({"FORKSERVE__READY_FD": str(write_end)})
        assert role.ready_fd == write_end and not os.get_inheritable(write_end)
    finally:
        os.close(read_end)
        os.close(write_end)


def test_systemd_socket_activation_is_adopted_only_by_the_pid_it_names():
    environ = {"LISTEN_FDS": "2", "LISTEN_PID": "42", "LISTEN_FDNAMES": "a:b"}
    assert systemd.listen_fds(dict(environ), 42) == (3, 4)
    assert systemd.listen_fds(environ, 43) is None
    assert environ == {}  # not for the application's children either way


@pytest.mark.parametrize("cls, installed", [(Master, MASTER_SIGNALS),
                                            (Supervisor, MASTER_SIGNALS),
                                            (SingleServer, SINGLE_SIGNALS)])
def test_every_declared_signal_has_a_handler_method_in_each_process(cls, installed):
    for signum in installed:
        assert callable(getattr(cls, handler_name(signum))), (cls, signum)


def test_usr2_reloads_as_hup_does():
    assert Master.handle_usr2 is Master.handle_hup
    assert Supervisor.handle_usr2 is Supervisor.handle_hup
    assert SingleServer.handle_usr2 is SingleServer.handle_hup


def test_signals_table_has_abrt_which_workers_handle_and_the_master_does_not_install():
    row = next(line for line in signals_table().splitlines() if line.startswith("| ABRT |"))
    assert "worker_abort" in row and "--timeout" in row
    assert signal.SIGABRT not in MASTER_SIGNALS and signal.SIGABRT not in SINGLE_SIGNALS


def test_docs_signals_table_is_generated_from_the_declarations():
    page = (pathlib.Path(__file__).resolve().parent.parent / "docs" / "signals.md").read_text()
    assert signals_table() in page, (
        "docs/signals.md's table is stale: paste in the output of "
        "python -m forkserve.process.signals")


def test_the_dashboard_history_crosses_the_exec_into_the_supervisor_in_a_memfd():
    import json

    from forkserve.memory.history import History
    from forkserve.process import generation_protocol

    history = History()
    history.events.append({"t": 1000.0, "kind": "recycle", "text": "worker 1: pid 2 replaced by 3"})
    history.generation = 1
    fd = generation_protocol._history_fd(history)
    assert os.get_inheritable(fd)  # it must survive execve
    state = json.loads(json.dumps({"history_fd": fd}))
    taken = generation_protocol.taken_history(state)
    assert taken.to_json() == history.to_json()
    with pytest.raises(OSError):
        os.fstat(fd)  # closed once read
    assert generation_protocol.taken_history({"history_fd": None}) is None
