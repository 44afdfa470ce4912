"""Progress while the application loads: lines during a pure-CPU import, and
nothing left behind (no thread, no timer) in the master or the workers."""

import re

import pytest

from forkserve.process import progress

from forkserve_testing import poll


def test_progress_lines_say_elapsed_time_and_rss():
    assert progress.format_progress("app:app", 12.34, 3 * 2**30) == \
        "still loading app:app: 12.3 s, RSS 3072 MB"
    assert progress.format_progress("app:app", 40.0, 2**20, done=True) == \
        "loaded app:app in 40.0 s (RSS 1 MB)"
    assert progress.format_progress("a", 1, None) == "still loading a: 1.0 s, RSS unknown"


def test_progress_shows_during_pure_cpu_work_and_the_timer_is_gone_after(caplog):
    import signal
    import threading
    import time
    caplog.set_level("INFO", logger="forkserve.error")
    before = threading.active_count()
    handler = signal.getsignal(signal.SIGALRM)
    with progress.loading("busy:app", interval=0.05):
        deadline = time.monotonic() + 0.3
        while time.monotonic() < deadline:  # pure CPU, never sleeps
            sum(range(1000))
    assert threading.active_count() == before
    assert signal.getsignal(signal.SIGALRM) is handler
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    messages = [record.getMessage() for record in caplog.records]
    assert messages[0] == "loading busy:app"
    assert any(message.startswith("still loading busy:app:") for message in messages[1:-1])
    assert messages[-1].startswith("loaded busy:app in 0.3 s")


def test_an_application_that_takes_sigalrm_while_loading_keeps_its_handler_and_alarm(caplog):
    import signal
    caplog.set_level("INFO", logger="forkserve.error")
    handler = signal.getsignal(signal.SIGALRM)
    fired = []

    def own(signum, frame):
        fired.append(signum)

    try:
        with progress.loading("alarming:app", interval=0.05):
            signal.signal(signal.SIGALRM, own)  # as an app's import might
            signal.setitimer(signal.ITIMER_REAL, 30)
        assert signal.getsignal(signal.SIGALRM) is own
        assert 29 < signal.getitimer(signal.ITIMER_REAL)[0] <= 30
        assert any("installed its own SIGALRM handler" in record.getMessage()
                   for record in caplog.records)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, handler)


def threads(pid):
    with open(f"/proc/{pid}/status") as handle:
        return int(re.search(r"Threads:\s+(\d+)", handle.read()).group(1))


@pytest.mark.e2e
def test_a_long_pure_cpu_import_shows_progress_and_leaves_no_thread(run_server):
    server = run_server("-w", "2", "--load-progress-interval", "0.5", app="slowload:app",
                        env={"LOAD_SECONDS": "2"})
    log = server.log()
    start = log.index("loading slowload:app")
    done = log.index("loaded slowload:app in ")
    assert start < done < log.index("Listening at:")
    assert log.count("still loading slowload:app:") >= 2
    assert re.search(r"loaded slowload:app in \d+\.\d s \(RSS \d+ MB\)", log)
    workers = poll(lambda: len(server.children()) == 2 and server.children(),
                   message="2 workers")
    assert [threads(pid) for pid in [server.pid, *workers]] == [1, 1, 1]
