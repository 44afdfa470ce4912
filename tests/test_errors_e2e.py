"""Bad input: each gets one clear message, a non-zero exit, and no process left."""

import os
import socket
import time

import pytest


pytestmark = pytest.mark.e2e


def _fails(run_server, *args, app, expect_status, expect_text, traceback_ok=False):
    started = time.monotonic()
    server = run_server(*args, app=app, wait=False)
    status = server.wait_exit(15)
    elapsed = time.monotonic() - started
    log = server.log()
    assert status == expect_status, log
    assert expect_text in log, log
    assert elapsed < 10, f"took {elapsed:.1f}s to fail"
    if not traceback_ok:  # a user error is one message, not a stack dump
        assert "Traceback" not in log or "Application traceback" in log
    with pytest.raises(ProcessLookupError):
        os.killpg(server.pid, 0)  # nothing left in the server's process group
    return log


def test_missing_module(run_server):
    log = _fails(run_server, app="no_such_module:app", expect_status=4,
                 expect_text="cannot import 'no_such_module'")
    assert "--chdir" in log


def test_missing_attribute_names_the_callables_it_has(run_server):
    log = _fails(run_server, app="factory:nope", expect_status=4,
                 expect_text="has no attribute 'nope'")
    assert "create_app" in log


def test_attribute_that_is_not_an_application(run_server):
    _fails(run_server, app="factory:not_callable", expect_status=4,
           expect_text="not a WSGI application")


def test_app_that_raises_at_import_shows_its_traceback(run_server):
    log = _fails(run_server, app="broken:app", expect_status=4,
                 expect_text="the application raised while loading")
    assert "the dataset file is corrupt" in log and "Application traceback" in log


def test_bad_flag_value(run_server):
    _fails(run_server, "-w", "many", app="basic:app", expect_status=2,
           expect_text="--workers (workers): expected a whole number >= 0, got 'many'")


def test_unknown_flag_gets_did_you_mean(run_server):
    _fails(run_server, "--wrokers", "2", app="basic:app", expect_status=2,
           expect_text="unknown option --wrokers; did you mean --workers?")


def test_bad_config_file_key(run_server, tmp_path):
    config = tmp_path / "forkserve.toml"
    config.write_text("wrokers = 2\n")
    _fails(run_server, "-c", str(config), app="basic:app", expect_status=2,
           expect_text="unknown setting 'wrokers'; did you mean 'workers'?")


def test_port_in_use_fails_fast_before_loading(run_server):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    try:
        _fails(run_server, "-b", f"127.0.0.1:{port}", app="broken:app", expect_status=5,
               expect_text="address already in use")
    finally:
        taken.close()


def test_workers_that_fail_to_boot_stop_the_master(run_server):
    log = _fails(run_server, "-w", "2", app="bootfail:app", expect_status=3,
                 expect_text="workers failed to boot", traceback_ok=True)
    assert "worker boot failure (raised on purpose by a test)" in log
    # the line that says why the server stopped quotes the worker's error
    assert ("Shutting down: workers failed to boot 5 times in a row; the last one's error: "
            "RuntimeError: worker boot failure (raised on purpose by a test)") in log


def test_check_config_loads_the_app_and_exits_zero(run_server):
    server = run_server("--check-config", app="basic:app", wait=False)
    assert server.wait_exit(15) == 0
    assert "configuration OK" in server.log()


def test_the_config_file_read_is_named_in_the_log(run_server, tmp_path):
    (tmp_path / "gunicorn.conf.py").write_text("keepalive = 3\n")
    server = run_server("--check-config", app="basic:app", cwd=str(tmp_path), wait=False,
                        env={"PYTHONPATH": os.path.join(os.path.dirname(__file__), "apps")})
    assert server.wait_exit(15) == 0, server.log()
    assert (f"Config file read: {tmp_path / 'gunicorn.conf.py'} (found in the working "
            "directory)") in server.log()
