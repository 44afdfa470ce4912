"""End-to-end: the real `python -m forkserve`, real sockets, real signals."""

import http.client
import os
import re
import signal
import socket
import threading

import pytest

from forkserve_testing import poll

pytestmark = pytest.mark.e2e


def test_requests_are_served_by_n_distinct_worker_pids(run_server):
    server = run_server("-w", "3")
    pids = server.wait_workers(3)
    assert server.pid not in pids
    assert len(set(pids)) == 3


def test_the_first_log_line_names_the_version_and_the_application_and_no_internals(run_server):
    import forkserve
    server = run_server("-w", "1")
    first = server.log().splitlines()[0]
    assert f"[INFO] Starting forkserve {forkserve.__version__} serving basic:app (Python " \
        in first, first
    assert "threading.local" not in server.log()  # an implementation detail: DEBUG


def test_worker_killed_with_sigkill_is_replaced_and_serving_continues(run_server):
    server = run_server("-w", "2")
    before = server.wait_workers(2)
    os.kill(before[0], signal.SIGKILL)
    after = poll(lambda: (lambda pids: before[0] not in pids and len(pids) == 2 and pids)(
        server.children()), message="a replacement worker")
    assert server.get("/pid")[0] == 200
    assert before[0] not in server.wait_workers(2)
    assert "was killed by SIGKILL" in server.log()
    assert set(after) != set(before)


def test_term_lets_a_slow_in_flight_request_finish(run_server, tmp_path):
    server = run_server("-w", "1", "--graceful-timeout", "10", env={"MARK_DIR": str(tmp_path)})
    server.wait_workers(1)
    result = {}

    def slow():
        result["response"] = server.get("/slow?1.5", timeout=15)

    client = threading.Thread(target=slow)
    client.start()
    poll(lambda: _in_flight(tmp_path), message="the slow request to start")
    server.signal(signal.SIGTERM)
    client.join(15)
    assert result["response"] == (200, "slow done")
    assert server.wait_exit(15) == 0


def _in_flight(mark_dir):
    return any(name.startswith("slow-") for name in os.listdir(mark_dir))


def test_int_stops_at_once_with_status_zero(run_server):
    server = run_server("-w", "2")
    server.wait_workers(2)
    server.signal(signal.SIGINT)
    assert server.wait_exit(10) == 0
    assert server.children() == []


def test_ttin_and_ttou_change_the_worker_count(run_server):
    server = run_server("-w", "2")
    server.wait_workers(2)
    server.signal(signal.SIGTTIN)
    server.wait_workers(3)
    # Standard signals sent back to back coalesce, so wait for each to land.
    server.signal(signal.SIGTTOU)
    poll(lambda: len(server.children()) == 2, message="two workers left")
    server.signal(signal.SIGTTOU)
    poll(lambda: len(server.children()) == 1, message="one worker left")
    server.signal(signal.SIGTTOU)  # never below one
    poll(lambda: "TTOU ignored" in server.log(), message="the third TTOU to be refused")
    assert len(server.wait_workers(1)) == 1


def test_worker_whose_loop_is_blocked_past_timeout_is_replaced(run_server):
    server = run_server("-w", "1", "--timeout", "1")
    [blocked] = server.wait_workers(1)
    with pytest.raises(OSError):
        server.get("/block?30", timeout=10)  # the worker is killed under the request
    poll(lambda: server.children() and blocked not in server.children(),
         message="the blocked worker to be replaced")
    assert server.get("/pid")[0] == 200
    assert "timed out" in server.log()


def test_workers_keep_the_memory_discipline(run_server):
    server = run_server("-w", "2", "--worker-gc", "off")  # other policies: test_memory_e2e
    server.wait_workers(2)
    for _ in range(4):
        info = server.get_json("/gc")
        assert info["threshold"][0] == 0
        assert info["freeze_count"] > 0
        assert info["multiprocess"] is True
        assert info["pid"] != server.pid


def test_single_process_mode_serves_with_no_child_processes(run_server):
    server = run_server("-w", "0")
    info = server.get_json("/gc")
    assert info["pid"] == server.pid
    # the loaded heap frozen; the process's own garbage collected by --worker-gc (normal)
    assert info["threshold"] == [700, 10, 10] and info["freeze_count"] > 0
    assert info["multiprocess"] is False
    assert server.children() == []
    server.signal(signal.SIGTERM)
    assert server.wait_exit(10) == 0


def test_single_process_mode_term_lets_slow_request_finish(run_server, tmp_path):
    server = run_server("-w", "0", env={"MARK_DIR": str(tmp_path)})
    result = {}
    client = threading.Thread(target=lambda: result.update(r=server.get("/slow?1", timeout=10)))
    client.start()
    poll(lambda: _in_flight(tmp_path), message="the slow request to start")
    server.signal(signal.SIGTERM)
    client.join(10)
    assert result["r"] == (200, "slow done")
    assert server.wait_exit(10) == 0


@pytest.mark.parametrize("workers", ["2", "0"])
def test_exit_runs_app_atexit_handlers_but_not_interpreter_finalization(run_server, tmp_path,
                                                                       workers):
    server = run_server("-w", workers, app="witness:app", env={"WITNESS_DIR": str(tmp_path)})
    pids = server.wait_workers(int(workers)) if workers != "0" else []
    server.signal(signal.SIGTERM)
    assert server.wait_exit(15) == 0
    events = sorted(name for name in os.listdir(tmp_path) if "-" in name and
                    not name.startswith("server-"))
    expected = sorted(f"atexit-{pid}" for pid in [server.pid, *pids])
    assert events == expected, server.log()


def test_max_requests_recycles_a_worker_replacement_first(run_server):
    server = run_server("-w", "1", "--max-requests", "5")
    [first] = server.wait_workers(1)
    statuses = [server.get("/pid")[0] for _ in range(12)]
    assert statuses == [200] * 12
    # The master logs the exit once it reaped the worker (a moment after the
    # worker left /proc's children): wait for the line, not for the process.
    old_exit = poll(lambda: re.search(rf"Worker 1 \(pid {first}\) exited", server.log()),
                    message="the worker to be recycled")
    log = server.log()
    assert "--max-requests" in log
    assert first not in server.children()
    # The replacement said it serves (it logs that just before the master can
    # see it ready) before the master let the old worker go.
    # The replacement takes the retiring worker's number (1) with a new pid.
    replacement = next((match for match in re.finditer(r"Booting worker 1 with pid: (\d+)", log)
                        if int(match.group(1)) != first), None)
    assert replacement, log
    assert replacement.start() < old_exit.start(), log


def test_hup_reloads_into_a_new_generation_under_the_same_master_pid(run_server):
    server = run_server("-w", "2")
    before = set(server.wait_workers(2))
    server.signal(signal.SIGHUP)
    poll(lambda: not before & {int(server.get("/pid")[1]) for _ in range(6)},
         timeout=20, message="answers from new workers only")
    poll(lambda: not before & set(_descendants(server.pid)), message="old workers gone")
    assert server.proc.poll() is None and server.get("/pid")[0] == 200
    # A reload, not a restart of the workers: the master's one child now is
    # generation 2 (a new interpreter), whose children serve.
    [generation] = server.children()
    workers = set(_descendants(generation))
    assert len(workers) == 2 and {int(server.get("/pid")[1]) for _ in range(6)} <= workers
    log = server.log()
    assert f"started generation 2 (pid {generation})" in log
    assert "continues as its supervisor" in log


def _descendants(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as handle:
            children = [int(child) for child in handle.read().split()]
    except FileNotFoundError:
        return []  # exited while we looked
    return children + [grandchild for child in children for grandchild in _descendants(child)]


def test_pid_file_is_written_and_removed(run_server, tmp_path):
    pidfile = tmp_path / "server.pid"
    server = run_server("-w", "1", "--pid", str(pidfile))
    assert int(pidfile.read_text()) == server.pid
    server.signal(signal.SIGTERM)
    assert server.wait_exit(10) == 0
    assert not pidfile.exists()


def test_pid_file_exists_when_listening_is_logged(run_server, tmp_path):
    """Scripts wait for "Listening at" and then read the pid file (Gunicorn writes it
    first too); a handler on the log records whether it existed at that moment."""
    pidfile, seen = tmp_path / "server.pid", tmp_path / "seen"
    config = tmp_path / "probe.conf.py"
    config.write_text('logconfig_dict = {"root": {"level": "INFO", "handlers": []}, '
                      '"handlers": {"probe": {"()": "pid_file_probe.Handler"}, '
                      '"console": {"class": "logging.StreamHandler"}}, '
                      '"loggers": {"gunicorn.error": {"handlers": ["probe", "console"], '
                      '"level": "INFO"}}}\n')
    server = run_server("-w", "1", "--pid", str(pidfile), "-c", str(config),
                        env={"PROBE_OUT": str(seen), "PROBE_PID_FILE": str(pidfile)}, wait=False)
    poll(seen.exists, 30, message="the probe's note")
    assert seen.read_text() == "True\n"
    server.signal(signal.SIGTERM)
    assert server.wait_exit(10) == 0


def test_factory_spec_with_literal_arguments(run_server):
    server = run_server("-w", "1", app="factory:create_app('hi', punctuation='?')")
    assert server.get("/") == (200, "hi?")


def test_settings_from_a_pyproject_toml_table(run_server, tmp_path):
    config = tmp_path / "pyproject.toml"
    config.write_text('[tool.forkserve]\nworkers = 3\nmax-requests = 1000\n')
    server = run_server("-c", str(config))
    assert len(server.wait_workers(3)) == 3


def test_settings_from_a_python_config_file_and_environment(run_server, tmp_path):
    config = tmp_path / "forkserve.conf.py"
    config.write_text("workers = 3\nimport os\n")
    server = run_server("-c", str(config), env={"FORKSERVE_WORKERS": "2"})
    assert len(server.wait_workers(2)) == 2  # the environment beats the file


def test_unix_socket_bind(run_server, tmp_path):
    path = tmp_path / "app.sock"
    server = run_server("-w", "1", "-b", f"unix:{path}", wait=False)
    poll(lambda: "Listening at: unix:" in server.log(), message="the unix listener")
    with socket.socket(socket.AF_UNIX) as client:
        client.connect(str(path))
        client.sendall(b"GET /pid HTTP/1.0\r\n\r\n")
        data = b""
        while chunk := client.recv(4096):
            data += chunk
    assert data.startswith(b"HTTP/1.1 200")
    server.signal(signal.SIGTERM)
    server.wait_exit(10)
    assert not path.exists()


@pytest.mark.parametrize("workers", ["2", "0"])
def test_usr1_reopens_log_files_that_logrotate_moved(run_server, tmp_path, workers):
    error_log, access_log = tmp_path / "error.log", tmp_path / "access.log"
    server = run_server("-w", workers, "--error-logfile", str(error_log),
                        "--access-logfile", str(access_log), wait=False)
    server.log_path = str(error_log)  # the server logs there, not to its stdout
    poll(error_log.exists, message="the error log")
    server.wait_listening()
    if workers != "0":
        server.wait_workers(2)
    assert server.get("/pid")[0] == 200
    error_log.rename(tmp_path / "error.log.1")
    access_log.rename(tmp_path / "access.log.1")
    server.signal(signal.SIGUSR1)

    batches = []

    def requests_land_in_the_new_access_log():
        # Lines reach the file up to AccessFileHandler.flush_interval after
        # their request, so an earlier batch is checked while a new one goes.
        batch = [f"/pid?batch={len(batches)}&n={n}" for n in range(4)]
        for path in batch:
            assert server.get(path)[0] == 200
        batches.append(batch)
        text = access_log.read_text() if access_log.exists() else ""
        return any(all(path in text for path in earlier) for earlier in batches)
    # Once every process reopened, every request is logged in the new file.
    poll(requests_land_in_the_new_access_log, message="requests in the new access log")
    server.signal(signal.SIGTTIN)  # logs a line in the master (or the single process)
    poll(lambda: error_log.exists() and "TTIN" in error_log.read_text(),
         message="new lines in the new error log")
    assert "TTIN" not in (tmp_path / "error.log.1").read_text()


def test_a_stalled_stats_client_blocks_neither_other_stats_clients_nor_signals(run_server):
    server = run_server("-w", "1", "--stats", "127.0.0.1:0")
    port = int(re.search(r"Stats at: http://127\.0\.0\.1:(\d+)", server.log()).group(1))
    server.wait_workers(1)
    stalled = socket.create_connection(("127.0.0.1", port))
    stalled.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")  # and never the blank line
    silent = socket.create_connection(("127.0.0.1", port))  # sends nothing at all
    try:
        for path in ("/", "/metrics"):
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            connection.request("GET", path)
            assert connection.getresponse().status == 200
            connection.close()
        server.signal(signal.SIGTTIN)
        assert len(server.wait_workers(2)) == 2
        server.signal(signal.SIGTERM)
        assert server.wait_exit(20) == 0
    finally:
        stalled.close()
        silent.close()


@pytest.mark.parametrize("workers", ["0", "1"])
def test_a_closed_connection_is_freed_without_waiting_for_a_collection(run_server, workers):
    # --worker-gc off: nothing collects the serving process's cycles, so a
    # handler kept alive by a reference cycle would still be found by gc.
    server = run_server("-w", workers, "--worker-gc", "off", app="gc_probe:app")
    for n in range(30):
        # each on its own connection, which the client closes after the
        # response or asks the server to close (the server then ends the
        # connection with the request still its current one)
        headers = {"Connection": "close"} if n % 2 else {}
        assert server.get("/", headers=headers)[0] == 200
    # in the end only the one serving the asking request, and maybe the one
    # before it (others may still be reading their client's close a moment);
    # before, all 30 stayed, uncollected
    poll(lambda: int(server.get("/handlers")[1]) <= 2, message="the closed connections freed")


@pytest.mark.parametrize("flags, collected", [((), True), (("--worker-gc", "young"), False)],
                         ids=["default", "young"])
def test_by_default_a_worker_collects_cyclic_garbage_promoted_to_the_oldest_generation(
        run_server, flags, collected):
    server = run_server("-w", "1", *flags, app="gc_probe:app")
    for _ in range(20):
        assert server.get("/promote") == (200, "promoted")
    assert server.get("/leftovers") == (200, "20")
    for _ in range(20):  # 40,000 cycles: collections of every generation the policy has
        assert server.get("/churn") == (200, "churned")
    assert server.get("/leftovers") == (200, "0" if collected else "20")


def test_a_single_process_collects_its_own_garbage_by_the_worker_gc_policy(run_server):
    normal = run_server("-w", "0", app="gc_probe:app")  # the default: normal
    assert normal.get("/threshold") == (200, "700 10 10")
    young = run_server("-w", "0", "--worker-gc", "young", app="gc_probe:app")
    assert young.get("/threshold") == (200, f"700 10 {1 << 30}")
