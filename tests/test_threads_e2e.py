"""End-to-end: a master that forks its workers with other threads alive says
so in its log, once, with the count the kernel gives (C threads included)."""

import pytest

pytestmark = pytest.mark.e2e

WARNING = "threads alive as it forks a worker"


def test_a_python_thread_alive_at_the_fork_is_named_once(run_server):
    server = run_server("-w", "2", "--no-monkey-patch", app="threaded:app",
                        env={"THREAD": "python"})
    server.wait_workers(2)
    log = server.log()
    assert log.count(WARNING) == 1, log
    assert ("The master has 2 threads alive as it forks a worker: 1 besides its own, "
            "1 started by Python's threading module (poller).") in log
    assert "post_fork" in log


def test_a_c_thread_the_threading_module_never_sees_is_counted(run_server):
    server = run_server("-w", "2", app="threaded:app", env={"THREAD": "c"})
    server.wait_workers(2)
    log = server.log()
    assert log.count(WARNING) == 1, log
    assert ("The master has 2 threads alive as it forks a worker: 1 besides its own, "
            "1 not (C threads: faulthandler.dump_traceback_later's watchdog") in log


def test_a_single_threaded_master_says_nothing_about_threads(run_server):
    server = run_server("-w", "2")
    server.wait_workers(2)
    assert WARNING not in server.log()


def test_a_multi_threaded_fork_under_warnings_as_errors_keeps_its_worker(run_server):
    # Python 3.15 raises its multi-threaded-fork DeprecationWarning, made an
    # error here, from fork() in the parent once the child exists: unless the
    # master's fork ignores it, the worker runs on with its pid lost. (Python
    # finds a Python thread here; it misses the C ones in a titled process.)
    server = run_server("-w", "2", "--no-monkey-patch", app="threaded:app",
                        env={"THREAD": "python", "PYTHONWARNINGS": "error::DeprecationWarning"})
    pids = server.wait_workers(2)
    assert sorted(server.children()) == pids
    assert server.log().count(WARNING) == 1
