"""The benchmark harness: its pure parts, and one tiny end-to-end run.

The unit tests drive report.py, harness/wrk.py's parser, harness/procs.py's /proc parser,
the time budget and the server command lines with made-up data. The e2e
tests run benchmarks/run.py on a 400-row dataset with two servers (a few
seconds) and check it cleans up after itself, also when it is interrupted.
"""

import os
import pathlib
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from benchmarks import run
from benchmarks.harness import report
from benchmarks.harness import servers
from benchmarks.harness import wrk as load
from benchmarks.harness.procs import parse_cpu_seconds
from benchmarks.harness.results import Result

ROOT = pathlib.Path(__file__).resolve().parent.parent
MIB = 1024 * 1024


def phase(responses=1000, duration_s=1.0, p50_us=1000, p99_us=5000, bad=0, read=0, timeouts=0):
    return load.PhaseResult(
        responses=responses, duration_s=duration_s, ok=responses - bad, not_found=0,
        bad_status=bad, connect_errors=0, read_errors=read, write_errors=0, timeouts=timeouts,
        p50_us=p50_us, p90_us=p50_us, p99_us=p99_us, p999_us=p99_us, max_us=p99_us,
    )


def sample(point, phase_no, responses, pid, role, rss, pss, uss, faults=0, cpu=0.0, file=0):
    return {
        "server": "x", "phase": phase_no, "point": point, "t_s": 0.0, "responses": responses,
        "pid": pid, "role": role, "rss": rss * MIB, "pss": pss * MIB, "uss": uss * MIB,
        "private": (uss - file) * MIB, "file": file * MIB, "shared": (rss - uss) * MIB, "swap": 0, "minor_faults": faults, "major_faults": 0,
        "cpu_s": cpu,
    }


def prefork_run(name="gunicorn", worker_growth=100):
    """A master (pid 1) with two workers, loaded then after one phase."""
    run_ = report.ServerRun(name, "test server")
    run_.samples = [
        sample("loaded", 0, 0, 1, "master", 1000, 400, 390, cpu=1.0),
        sample("loaded", 0, 0, 2, "worker", 1000, 300, 10, faults=100, cpu=0.5),
        sample("loaded", 0, 0, 3, "worker", 1000, 300, 10, faults=100, cpu=0.5),
        sample("during", 1, "", 2, "worker", 1000, 320, 30),
        sample("phase_end", 1, 2000, 1, "master", 1000, 350, 390, cpu=1.0),
        sample("phase_end", 1, 2000, 2, "worker", 1000, 400, 10 + worker_growth,
               faults=1100, cpu=1.5),
        sample("phase_end", 1, 2000, 3, "worker", 1000, 400, 10 + worker_growth,
               faults=2100, cpu=1.5),
    ]
    run_.phases = [phase(1000, 0.5, p50_us=2000, p99_us=9000),
                   phase(1000, 1.5, p50_us=4000, p99_us=7000, bad=3, read=50)]
    run_.startup_s, run_.stop_s = 2.0, 0.5
    return run_


# -- report ---------------------------------------------------------------------------


def test_figures_of_a_prefork_run():
    f = report.figures(prefork_run())
    assert f["master_rss"] == 1000 * MIB
    assert f["pss_loaded"] == 1000 * MIB and f["pss_final"] == 1150 * MIB
    assert f["worker_uss"] == 110 * MIB
    assert (f["worker_private"], f["worker_file"]) == (110 * MIB, 0)
    assert f["shared"] == pytest.approx(0.89)
    assert f["cow_faults"] == 1500
    assert f["rps"] == 1000  # 2000 responses in 2 s
    assert f["cpu_us"] == pytest.approx(1000.0)  # 2 CPU-seconds over 2000 responses
    assert (f["p50_ms"], f["p99_ms"]) == (3.0, 9.0)  # median of p50s, worst p99
    assert f["errors"] == 3 and f["closed"] == 50


def test_single_process_run_has_no_shared_fraction():
    run_ = report.ServerRun("single", "one process")
    run_.samples = [sample("loaded", 0, 0, 9, "single", 500, 480, 470, file=300),
                    sample("phase_end", 1, 10, 9, "single", 510, 490, 480, file=300)]
    run_.phases = [phase(10)]
    f = report.figures(run_)
    assert f["shared"] is None
    assert f["master_rss"] == 500 * MIB and f["worker_uss"] == 480 * MIB
    assert (f["worker_private"], f["worker_file"]) == (180 * MIB, 300 * MIB)


def test_ratio_handles_missing_and_zero():
    assert report.ratio(3, 2) == 1.5
    assert report.ratio(None, 2) is None
    assert report.ratio(3, None) is None
    assert report.ratio(3, 0) is None


def test_markdown_has_ratios_to_the_baseline_and_lists_skips():
    runs = [prefork_run("gunicorn"), prefork_run("forkserve-share", worker_growth=0),
            report.ServerRun("forkserve-x", "x", status="skipped", reason="needs Python 3.12+")]
    text = report.render_markdown(runs, {"title": "t", "date": "today"})
    gunicorn = next(line for line in text.splitlines() if line.startswith("| `gunicorn` |"))
    share = next(line for line in text.splitlines() if line.startswith("| `forkserve-share` |"))
    assert "110 MiB (1.00×)" in gunicorn
    assert "10 MiB (0.09×)" in share
    assert "- `forkserve-x` (skipped): needs Python 3.12+" in text
    assert "- **date**: today" in text


def test_markdown_without_the_baseline_has_no_ratios():
    text = report.render_markdown([prefork_run("forkserve-dict")], {})
    assert "(1.00×)" not in text and "did not run, so no ratios" in text


def test_summary_csv_has_a_row_per_server(tmp_path):
    runs = [prefork_run("gunicorn"),
            report.ServerRun("uwsgi", "u", status="failed", reason="exited")]
    path = tmp_path / "summary.csv"
    with open(path, "w", newline="") as f:
        report.write_summary_csv(runs, f)
    lines = path.read_text().splitlines()
    assert lines[0].startswith("server,description,status,reason,")
    assert "ratio_rps" in lines[0]
    assert lines[1].startswith("gunicorn,test server,ok,")
    assert lines[2].startswith("uwsgi,u,failed,exited")


# -- load, procs, budget, servers ------------------------------------------------------


WRK_OUTPUT = textwrap.dedent("""\
    Running 45s test @ http://127.0.0.1:1234
      1 threads and 32 connections
    BENCH_RESULT {"requests": 1010, "duration_us": 2000000, "ok": 950, "not_found": 50, \
"bad_status": 2, "closes": 20, "connect_errors": 1, "read_errors": 20, "write_errors": 0, \
"timeouts": 3, "status_errors": 52, "p50_us": 800, "p90_us": 1500, "p99_us": 4000, \
"p999_us": 9000, "max_us": 12000, "mean_us": 900.5}
""")


def test_wrk_result_is_parsed_and_read_errors_are_not_failures():
    result = load.parse_result(WRK_OUTPUT)
    assert result.responses == 1002 and result.duration_s == 2.0
    assert result.rate == 501.0
    assert result.errors == 2 + 1 + 3
    assert result.read_errors == 20


def test_wrk_output_without_a_result_is_an_error():
    with pytest.raises(ValueError, match="no BENCH_RESULT"):
        load.parse_result("unable to connect to 127.0.0.1:1\n")


def test_cpu_seconds_are_read_after_the_last_parenthesis():
    fields = ["S", "1", "1", "1", "0", "-1", "0", "10", "0", "0", "0", "250", "50"] + ["0"] * 40
    line = "42 (a) (weird) name) " + " ".join(fields)
    assert parse_cpu_seconds(line, clock_ticks=100) == 3.0


def test_budget_shares_time_among_remaining_phases(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(run.time, "monotonic", lambda: now[0])
    budget = run.Budget(200.0, phases_per_server=4, servers=2)
    # 200 s, minus 20 s overhead for the server after this one, over 8
    # phases: a fair share is 22.5 s, and a phase may take twice that.
    assert budget.phase_cap(60.0, 4) == pytest.approx(45.0)
    assert budget.phase_cap(30.0, 4) == 30.0
    budget.server_done()
    now[0] += 160  # slow phases: 40 s left for 7 phases
    # Twice the fair share would be 11.4 s; keep 5 s for each of the other 6.
    assert budget.phase_cap(60.0, 7) == pytest.approx(40.0 - 6 * run.MIN_PHASE_S)
    now[0] += 40
    assert budget.phase_cap(60.0, 1) == run.MIN_PHASE_S


def test_forkserve_port_comes_from_its_log():
    spec = next(s for s in servers.persondb_servers() if s.name == "forkserve-dict")
    log = b"[INFO] Listening at: http://127.0.0.1:43121 (77)\n"
    assert spec.port_from_log(log) == 43121
    assert spec.port_from_log(b"[INFO] Booting\n") is None


def test_share_is_skipped_before_312_with_the_reason():
    spec = next(s for s in servers.persondb_servers() if s.name == "forkserve-share")
    reason = spec.skip_reason(sys.executable, (3, 11))
    assert "3.12+" in reason and "immortal" in reason
    # and says how to measure it (issue 33 item 8)
    assert "pass --python" in reason and "python3.12 -m venv .venv312" in reason


def test_servers_get_sockets_not_port_numbers():
    by_name = {s.name: s for s in servers.persondb_servers()}
    gunicorn = by_name["gunicorn"].command("python", 4, 7)
    assert "--preload" in gunicorn and "fd://7" in gunicorn
    uwsgi = by_name["uwsgi"].command("python", 4, 7)
    assert "LISTEN_PID=$$" in uwsgi[2] and "3<&7" in uwsgi[2]
    assert "--lazy-apps" not in uwsgi and "--master" in uwsgi
    forkserve = by_name["forkserve-dict"].command("python", 4, None)
    assert forkserve[forkserve.index("-b") + 1] == "127.0.0.1:0"
    single = by_name["forkserve-single"].command("python", 4, None)
    assert single[single.index("-w") + 1] == "0"


def test_gunicorn_conf_applies_the_gc_recipe():
    code = textwrap.dedent(f"""
        import gc, runpy, sys
        conf = runpy.run_path({str(ROOT / "benchmarks" / "apps" / "gunicorn.conf.py")!r})
        assert not gc.isenabled(), "gc.disable() before the app loads"
        conf["pre_fork"](None, None)
        assert gc.get_threshold()[0] == 0 and gc.get_freeze_count() > 0
        conf["post_fork"](None, None)
        sys.exit(3)  # the os._exit(0) registered by post_fork must win
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


# -- end to end ------------------------------------------------------------------------

needs_tools = pytest.mark.skipif(
    shutil.which("wrk") is None or not sys.platform.startswith("linux"),
    reason="the harness needs wrk and Linux /proc",
)


def _harness(tmp_path, *extra):
    return [
        sys.executable, str(ROOT / "benchmarks" / "run.py"),
        "--servers", "gevent-single,forkserve-dict", "--rows", "400", "--workers", "2",
        "--phases", "1", "--requests", "300", "--phase-timeout", "20",
        "--server-cpus", "", "--client-cpus", "",
        "--data-dir", str(tmp_path / "data"), "--out", str(tmp_path / "out"), *extra,
    ]


def _processes_using(marker):
    """Pids of live processes whose environment mentions ``marker``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if marker.encode() in f.read():
                    found.append(int(entry))
        except OSError:
            continue  # gone, or not ours to read
    return found


@pytest.mark.e2e
@needs_tools
def test_tiny_run_writes_every_result_and_leaves_no_process(tmp_path):
    proc = subprocess.run(_harness(tmp_path), cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = tmp_path / "out"
    expected = {"samples.csv", "summary.csv", "results.md", "result.json"}
    try:
        import matplotlib  # noqa: F401
        expected.add("memory.png")
    except ImportError:
        pass  # the harness says "no plot" and carries on
    assert expected <= set(os.listdir(out))
    results = (out / "results.md").read_text()
    assert "| `gevent-single` |" in results and "| `forkserve-dict` |" in results
    samples = (out / "samples.csv").read_text()
    assert ",loaded," in samples and ",phase_end," in samples
    result = Result.read(out / "result.json")
    assert result.scenario == "run.py" and result.command.startswith("python benchmarks/run.py")
    assert {row["server"] for row in result.rows} == {"gevent-single", "forkserve-dict"}
    assert set(result.conditions) == {"load_before", "load_after", "steal"}
    assert _processes_using(str(tmp_path / "data")) == []


@pytest.mark.e2e
@needs_tools
def test_interrupted_run_stops_every_process_it_started(tmp_path):
    harness = subprocess.Popen(
        _harness(tmp_path, "--requests", "10000000", "--phase-timeout", "60"),
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    try:
        deadline = time.monotonic() + 60
        seen = ""
        while "phase" not in seen and "ready on port" not in seen:
            assert time.monotonic() < deadline, seen
            seen += harness.stderr.readline()
        time.sleep(1.0)  # wrk and the server are both running now
        assert _processes_using(str(tmp_path / "data")), "server should be running"
        harness.send_signal(signal.SIGTERM)
        harness.communicate(timeout=60)
        assert harness.returncode != 0
        assert _processes_using(str(tmp_path / "data")) == []
    finally:
        if harness.poll() is None:
            harness.kill()
            harness.wait()


# -- balance, tail, the latency probe ----------------------------------------------


def test_balance_compares_the_busiest_process_with_the_mean():
    run_ = prefork_run()
    run_.worker_requests = {2: 300, 3: 100}
    run_.probes = [(0.0, 0.002, 200), (0.05, 0.004, 200), (0.1, 0.010, 404), (0.15, 10.0, 0)]
    b = report.balance_and_probes(run_)
    assert b["cpu_per_worker"] == [1.0, 1.0] and b["cpu_spread"] == 1.0
    assert b["requests_per_worker"] == [300, 100] and b["requests_spread"] == 1.5
    assert (b["probes"], b["probe_failures"]) == (4, 1)
    assert b["probe_p50_ms"] == 4.0 and b["probe_max_ms"] == 10.0
    assert report.spread([5]) is None and report.percentile([], 99) is None


def test_p999_is_the_worst_phase_and_the_page_has_a_balance_table():
    run_ = prefork_run()
    assert report.figures(run_)["p999_ms"] == 9.0
    text = report.render_markdown([run_], {})
    assert "| `gunicorn` | n/a (no per-worker counts) | — | 1.0, 1.0 | 1.00 |" in text


@pytest.mark.e2e
def test_latency_probe_records_answers_and_failures(tmp_path):
    import http.server
    import threading

    class Answer(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/person/a@x" else 404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    httpd = http.server.HTTPServer(("127.0.0.1", 0), Answer)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        probe = load.LatencyProbe(httpd.server_address[1], ["/person/a@x"], started=0.0)
        records = [probe.probe_once() for _ in range(3)]
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert [status for _, _, status in records] == [200, 200, 200]
    assert all(latency > 0 for _, latency, _ in records)
    gone = load.LatencyProbe(httpd.server_address[1], ["/"], started=0.0, timeout=1.0)
    assert gone.probe_once()[2] == 0
