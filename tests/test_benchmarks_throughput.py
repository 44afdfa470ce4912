"""benchmarks/throughput.py: its ratios to Granian, its line-up, and the
harness reading a server's port from /proc (Granian does not log it)."""

import os
import subprocess
import sys

import pytest

from benchmarks import throughput
from benchmarks.harness import servers
from benchmarks.harness.start import listening_port


def row(scenario, server, workers, rps, cpu_us=None):
    return {"scenario": scenario, "server": server, "workers": workers, "rps": rps,
            "cpu_us": cpu_us}


def test_ratios_are_to_granian_of_the_same_scenario():
    rows = throughput.add_ratios([
        row("persondb", "granian", 4, 20_000.0), row("persondb", "forkserve", 4, 15_000.0),
        row("persondb", "forkserve-w0", 0, 10_000.0),
        row("hello", "granian-w1", 1, 40_000.0), row("hello", "granian-w4", 4, 60_000.0),
        row("hello", "forkserve-w0", 0, 30_000.0), row("hello", "forkserve-w4", 4, 48_000.0),
    ])
    ratio = {(r["scenario"], r["server"]): r["rps_vs_granian"] for r in rows}
    assert ratio["persondb", "forkserve"] == 0.75
    assert ratio["persondb", "forkserve-w0"] == 0.5  # PersonDB: always Granian's 4 workers
    assert ratio["hello", "forkserve-w0"] == 0.75  # hello: Granian with 1 worker
    assert ratio["hello", "forkserve-w4"] == 0.8


def test_cpu_per_request_is_compared_with_granian_s_too():
    rows = throughput.add_ratios([row("hello", "granian-w1", 1, 40_000.0, cpu_us=25.0),
                                  row("hello", "forkserve-w0", 0, 30_000.0, cpu_us=30.0)])
    assert rows[1]["cpu_vs_granian"] == 1.2


def test_no_granian_row_means_no_ratio():
    rows = throughput.add_ratios([row("persondb", "forkserve", 4, 15_000.0)])
    assert rows[0]["rps_vs_granian"] is None


def test_servers_are_picked_by_name_or_scenario_and_name():
    args = throughput.parse_args(["--servers", "granian,hello:forkserve-w0"])
    chosen = throughput.selected(args)
    assert [s.name for s, _ in chosen["persondb"]] == ["granian"]
    assert [s.name for s, _ in chosen["hello"]] == ["forkserve-w0"]


def test_the_line_up_of_the_issue():
    lineup = servers.throughput_servers()
    persondb = {spec.name: (spec, workers) for spec, workers in lineup["persondb"]}
    assert list(persondb) == ["gunicorn", "uwsgi", "granian", "forkserve", "forkserve-noyield",
                              "forkserve-geventlocal", "forkserve-store", "forkserve-w0"]
    assert "--no-yield-cpu" in persondb["forkserve-noyield"][0].command("python", 4, None)
    assert "--no-c-local" in persondb["forkserve-geventlocal"][0].command("python", 4, None)
    granian = persondb["granian"][0].command("python", 4, None)
    assert granian[:3] == ["python", "-m", "granian"]
    assert "--workers" in granian and granian[granian.index("--workers") + 1] == "4"
    assert "--port" in granian and granian[granian.index("--port") + 1] == "0"
    assert "closes every connection" in persondb["uwsgi"][0].note
    assert persondb["forkserve-store"][0].mode == "store"
    assert [(s.name, w) for s, w in lineup["hello"]] == [
        ("granian-w1", 1), ("granian-w4", 4), ("forkserve-w0", 0), ("forkserve-w4", 4)]
    assert [(s.name, w) for s, w in lineup["hello-close"]] == [
        ("granian-w1", 1), ("granian-w4", 4), ("uwsgi", 4), ("gunicorn", 4),
        ("forkserve-w0", 0), ("forkserve-w4", 4)]
    assert [(s.name, w) for s, w in lineup["persondb-close"]] == [
        ("gunicorn", 4), ("uwsgi", 4), ("granian", 4), ("forkserve", 4)]


def test_the_close_scenarios_open_a_connection_per_request_and_compare_like_their_app():
    assert throughput.wrk_env("hello", None, 1) is None
    assert throughput.wrk_env("hello-close", None, 1) == {"BENCH_CLOSE": "1"}
    assert throughput.wrk_env("persondb", "e.txt", 1)["BENCH_CLOSE_RATIO"] == "0"
    assert throughput.wrk_env("persondb-close", "e.txt", 1)["BENCH_CLOSE_RATIO"] == "1"
    rows = throughput.add_ratios([
        row("persondb-close", "granian", 4, 10_000.0), row("persondb-close", "forkserve", 4, 5_000.0),
        row("hello-close", "granian-w4", 4, 20_000.0), row("hello-close", "forkserve-w4", 4, 25_000.0),
        row("hello-close", "granian-w1", 1, 8_000.0), row("hello-close", "forkserve-w0", 0, 10_000.0),
    ])
    ratio = {(r["scenario"], r["server"]): r["rps_vs_granian"] for r in rows}
    assert ratio["persondb-close", "forkserve"] == 0.5
    assert ratio["hello-close", "forkserve-w4"] == 1.25
    assert ratio["hello-close", "forkserve-w0"] == 1.25


def test_the_port_a_process_listens_on_is_read_from_proc():
    code = ("import socket, sys\n"
            "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
            "print(s.getsockname()[1], flush=True); sys.stdin.read()\n")
    with subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, text=True) as child:
        port = int(child.stdout.readline())
        assert listening_port([child.pid]) == port
        child.stdin.close()  # the child reads EOF and exits
        child.wait(timeout=10)
    assert listening_port([child.pid]) is None  # gone: no port, no error


def test_whether_the_heap_was_shared_is_taken_from_forkserve_s_log():
    log = (b"[2026-11-27 20:56:10 +0000] [24336] [INFO] loaded app in 8.8 s\n"
           b"[2026-11-27 20:56:10 +0000] [24336] [INFO] Heap sharing off: the C extension "
           b"forkserve.memory._immortal is not built\n")
    assert throughput.heap_sharing_line(log) == (
        "Heap sharing off: the C extension forkserve.memory._immortal is not built")
    assert throughput.heap_sharing_line(b"[INFO] Listening at: http://127.0.0.1:1\n") is None


def test_the_tls_scenarios_line_up_four_servers_on_one_certificate(tmp_path, monkeypatch):
    monkeypatch.setattr(servers, "TLS_DIR", str(tmp_path))
    cert, key = servers.tls_files(str(tmp_path))
    lineup = servers.throughput_servers()
    for scenario in ("tls-keepalive", "tls-close"):
        specs = {spec.name: (spec, workers) for spec, workers in lineup[scenario]}
        assert list(specs) == ["gunicorn", "uwsgi", "granian", "forkserve"]
        assert all(spec.tls and workers == 2 for spec, workers in specs.values())
        for name, flags in (("gunicorn", ["--certfile", cert, "--keyfile", key]),
                            ("forkserve", ["--certfile", cert, "--keyfile", key]),
                            ("granian", ["--ssl-certificate", cert, "--ssl-keyfile", key])):
            argv = specs[name][0].command("python", 2, 3)
            assert argv[-len(flags) - 1:] == flags + [servers.HELLO_APP], argv
        uwsgi = specs["uwsgi"][0].command("python", 2, None)
        assert uwsgi[uwsgi.index("--https-socket") + 1] == f"127.0.0.1:0,{cert},{key}"
    rows = throughput.add_ratios([row("tls-close", "granian", 2, 300.0),
                                  row("tls-close", "forkserve", 2, 330.0)])
    assert rows[1]["rps_vs_granian"] == 1.1


def test_the_certificate_is_made_once_with_openssl(tmp_path):
    first = servers.tls_files(str(tmp_path))
    made = [os.stat(path).st_mtime_ns for path in first]
    assert servers.tls_files(str(tmp_path)) == first
    assert [os.stat(path).st_mtime_ns for path in first] == made
    with open(first[0]) as handle:
        assert handle.read().startswith("-----BEGIN CERTIFICATE-----")


def test_a_tls_server_is_probed_and_loaded_over_https_with_and_without_keep_alive(tmp_path):
    """A smoke run of the harness on forkserve over TLS: the probe, and wrk
    with hello.lua kept alive and with Connection: close (BENCH_CLOSE=1)."""
    import shutil
    from benchmarks.harness import start, wrk
    if shutil.which("wrk") is None:
        pytest.skip("wrk is not installed")
    cert, key = servers.tls_files(str(tmp_path))
    server = start.start([sys.executable, "-m", "forkserve", "-w", "0", "-b", "127.0.0.1:0",
                          "--certfile", cert, "--keyfile", key, servers.HELLO_APP],
                         log_path=str(tmp_path / "server.log"), probe_path="/", tls=True,
                         env=dict(os.environ, PYTHONPATH=servers.REPO))
    try:
        assert server.url.startswith("https://127.0.0.1:")
        assert start.http_status(server.port, "/", tls=False) is None  # plain HTTP: refused
        for env in (None, {"BENCH_CLOSE": "1"}):
            result = wrk.parse_result(wrk.run(server.url + "/", 1, 2, None, str(tmp_path),
                                              env=env))
            assert result.ok > 0 and result.errors == 0, result
    finally:
        server.stop(grace=5)
