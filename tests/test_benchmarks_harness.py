"""The benchmark harness (benchmarks/harness): starting real servers, its
pure readers, the result schema, and the README table made from them."""

import os
import pathlib
import sys
import time

import pytest

from benchmarks.harness import index, machine, procs, results, servers, start, wrk

ROOT = pathlib.Path(__file__).resolve().parent.parent
ENV = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")


def test_every_scenario_says_what_it_measures_and_how_to_run_it():
    found = {s.name: (s.what, s.command) for s in index.scenarios()}
    assert {"run.py", "hello.py", "startup.py", "accesslog.py"} <= set(found)
    for name, (what, command) in found.items():
        assert what and command.startswith("python"), name


def test_a_scenario_without_a_command_in_its_docstring_is_refused(tmp_path):
    (tmp_path / "bare.py").write_text('"""Measures something."""\n\nif __name__ == "__main__":\n'
                                      '    pass\n')
    with pytest.raises(ValueError, match="bare.py: a scenario's docstring"):
        index.scenarios(str(tmp_path))


def test_started_forkserve_is_found_by_its_logged_port_and_stopped_with_its_group(tmp_path):
    argv = [sys.executable, "-m", "forkserve", "-w", "1", "-b", "127.0.0.1:0",
            servers.HELLO_APP]
    with start.start(argv, log_path=str(tmp_path / "server.log"), env=ENV, processes=2,
                     probe_path="/") as server:
        assert server.log().startswith(b"$ ")
        assert start.http_status(server.port, "/") == 200
        members = server.members()
        assert len(members) == 2 and server.pid in members
    assert procs.group_members(server.pid) == []


def test_a_server_handed_a_bound_socket_serves_on_its_port(tmp_path):
    spec = next(s for s in servers.hello_servers() if s.name == "gevent-pywsgi")
    with start.start_spec(spec, python=sys.executable, workers=1, env=ENV, probe_path="/",
                          log_path=str(tmp_path / "gevent.log")) as server:
        assert start.http_status(server.port, "/") == 200
        assert b"--fd" in server.log().splitlines()[0]


def test_a_server_that_exits_while_starting_fails_with_the_end_of_its_log(tmp_path):
    argv = [sys.executable, "-c", "print('no dataset here'); raise SystemExit(3)"]
    with pytest.raises(start.ServerFailed, match="status 3(.|\n)*no dataset here"):
        start.start(argv, log_path=str(tmp_path / "bad.log"), env=ENV, timeout=30)


def test_group_cpu_seconds_count_every_live_process_of_the_group(tmp_path):
    busy = "import time\nend = time.process_time() + 0.2\nwhile time.process_time() < end: pass\n"
    argv = [sys.executable, "-c", busy + "import signal; signal.pause()"]  # alive until the group ends
    with procs.Group(argv) as group:
        deadline = time.monotonic() + 30
        while procs.group_cpu_seconds(group.pid) < 0.2:
            assert time.monotonic() < deadline, "the child never used its CPU"
            time.sleep(0.02)
        assert procs.alive(group.pid)
    assert not procs.alive(group.pid)


def test_wrk_summary_gives_rate_count_and_errors():
    text = ("Running 1s test @ http://127.0.0.1:1/\n  1 threads and 50 connections\n"
            "  12312 requests in 1.00s, 1.2MB read\n  Non-2xx or 3xx responses: 7\n"
            "Requests/sec:  12312.50\nTransfer/sec:      1.2MB\n")
    summary = wrk.parse_summary(text)
    assert (summary.requests, summary.rate, summary.non_2xx) == (12312, 12312.5, 7)
    assert summary.failed
    with pytest.raises(ValueError, match="no summary"):
        wrk.parse_summary("wrk: connection refused\n")


def test_cpu_steal_is_read_from_proc_stat_cpu_line(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text("cpu  100 0 50 800 10 0 5 35 0 0\ncpu0 50 0 25 400 5 0 2 18 0 0\n")
    assert machine.cpu_times(str(stat)) == (35, 1000)


def test_conditions_give_load_and_steal_of_the_run():
    conditions = machine.Conditions().end()
    assert set(conditions.as_dict()) == {"load_before", "load_after", "steal"}
    assert 0.0 <= conditions.steal <= 1.0
    assert "CPU steal during the run" in conditions.describe()


def test_a_result_round_trips_and_a_foreign_file_is_refused(tmp_path):
    result = results.Result("hello.py", "python benchmarks/hello.py --quick",
                            [{"server": "forkserve-w0", "rps": 19095.0}],
                            conditions={"load_before": 1.0, "load_after": 2.0, "steal": 0.01})
    path = result.write(str(tmp_path))
    assert results.Result.read(path) == result
    index_lines = index.render([index.Scenario("hello.py", "Hello world.",
                                               "python benchmarks/hello.py")],
                               {"hello.py": [(result, "results/hello/result.json")]})
    assert "load 1.0, steal 1.0%" in index_lines[2]
    (tmp_path / "result.json").write_text('{"scenario": "x", "figures": []}')
    with pytest.raises(ValueError, match="unknown keys figures"):
        results.Result.read(str(tmp_path / "result.json"))
