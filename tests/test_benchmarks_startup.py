"""benchmarks/startup.py: the log watcher and the page, without a server."""

import time

from benchmarks import startup


def test_log_watcher_times_the_listening_and_booting_lines(tmp_path):
    log = tmp_path / "server.log"
    log.write_bytes(b"[x] [1] [INFO] Listening at: http://127.0.0.1:4321 (1)\n"
                    b"[x] [2] [INFO] Booting worker 1 with pid: 22\n[x] [3] [INFO] Boot")
    watcher = startup.LogWatcher(str(log))
    watcher.start()
    try:
        deadline = time.monotonic() + 10
        while not watcher.booted and time.monotonic() < deadline:
            time.sleep(0.01)
        with open(log, "ab") as f:  # the rest of a line written in two parts
            f.write(b"ing worker 2 with pid: 33\n")
        while len(watcher.booted) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        watcher.stop()
    assert watcher.port == 4321
    assert [pid for _, pid in watcher.booted] == [22, 33]
    assert watcher.listening_at <= watcher.booted[0][0] <= watcher.booted[1][0]


def test_page_shows_a_dash_for_what_was_not_measured():
    rows = [{"mode": "dict", "master_rss_mib": 930, "listening_s": 20.0, "first_answer_s": 20.5,
             "fork_first_s": 0.05, "fork_all_s": 0.4, "hup_new_answer_s": 21.0,
             "hup_old_gone_s": 22.0, "note": ""},
            {"mode": "share", "note": "needs Python 3.12+ (--python)"}]
    page = startup.render(rows, {"title": "t", "date": "today"})
    assert "| dict | 930 MiB | 20.00 | 20.50 | 0.050 | 0.400 | 21.00 | 22.00 |  |" in page
    assert "| share | — | — | — | — | — | — | — | needs Python 3.12+ (--python) |" in page
