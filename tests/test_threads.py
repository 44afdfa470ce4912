"""forkserve.process.threads: the count of a process's threads and the
master's warning, without a server."""

import logging
import os
import threading
import warnings

import pytest

from forkserve.process import threads

STATUS = "Name:\tpython3\nUmask:\t0022\nState:\tR (running)\nThreads:\t3\nSigQ:\t0/31457\n"


def test_the_thread_count_is_read_from_the_status_text():
    assert threads.parse_count(STATUS) == 3
    assert threads.parse_count("Name:\tpython3\n") is None


def test_the_count_includes_threads_the_threading_module_never_sees(tmp_path):
    # faulthandler's watchdog is one (pytest arms it for each test, see
    # faulthandler_timeout); a status file stands in for /proc elsewhere.
    status = tmp_path / "status"
    status.write_text(STATUS)
    assert threads.count(str(status)) == 3
    assert threads.count(str(tmp_path / "missing")) == threading.active_count()


def test_the_warning_names_python_threads_and_counts_the_others():
    text = threads.describe(4, ["poller", "sender"])
    assert text.startswith("The master has 4 threads alive as it forks a worker: 3 besides "
                           "its own, 2 started by Python's threading module (poller, sender) "
                           "and 1 not (C threads")
    assert "post_fork" in text
    assert "Python's threading" not in threads.describe(2, [])


def test_the_watch_warns_once_per_new_count(caplog):
    counts = iter([1, 3, 3, 3, 1, 1, 2])
    watch = threads.ThreadWatch(read=lambda: next(counts))
    with caplog.at_level(logging.WARNING, logger="forkserve.error"):
        for _ in range(7):
            watch.before_fork()
    said = [record.getMessage().split(":")[0] for record in caplog.records]
    assert said == ["The master has 3 threads alive as it forks a worker",
                    "The master has 2 threads alive as it forks a worker"]


def test_python_threads_lists_a_running_thread_by_name():
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, name="poller")
    thread.start()
    try:
        assert "poller" in threads.python_threads()
        assert threading.current_thread().name not in threads.python_threads()
    finally:
        stop.set()
        thread.join()


def _fork_that_warns_as_python_does():
    # Python 3.12+'s words, issued in the parent once the child exists
    warnings.warn(f"This process (pid={os.getpid()}) is multi-threaded, use of fork() may "
                  "lead to deadlocks in the child.", DeprecationWarning, stacklevel=2)
    return 4242


def test_a_fork_unwarned_returns_the_pid_where_the_warning_is_an_error():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(DeprecationWarning):
            _fork_that_warns_as_python_does()
        assert threads.unwarned(_fork_that_warns_as_python_does)() == 4242
        with pytest.raises(DeprecationWarning):  # ignored for that call only
            _fork_that_warns_as_python_does()
