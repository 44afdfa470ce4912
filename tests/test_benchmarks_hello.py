"""The hello-world benchmark's pure parts: wrk's output, the figures, the page."""

import dataclasses

import pytest

from benchmarks import hello

WRK_OUT = ('Running 3s test\nBENCH_RESULT {"requests": 3000, "duration_us": 3000000, '
           '"ok": 2990, "not_found": 0, "bad_status": 10, "connect_errors": 0, '
           '"read_errors": 5, "write_errors": 0, "timeouts": 1, "p50_us": 1000, '
           '"p90_us": 1500, "p99_us": 4000, "p999_us": 9000, "max_us": 12000, '
           '"mean_us": 1100.0}\n')


def rounds(server, cpu_s, scale=1.0):
    """Three rounds of 3000 responses taking 3 s, 6 s and 9 s (times ``scale``)."""
    out = []
    for n in (1, 2, 3):
        r = hello.parse_wrk(WRK_OUT, server, n, cpu_s)
        wrk = dataclasses.replace(r.wrk, duration_s=r.wrk.duration_s * scale * n)
        out.append(dataclasses.replace(r, wrk=wrk))
    return out


def test_a_round_reads_wrk_and_counts_non_200_as_errors():
    r = hello.parse_wrk(WRK_OUT, "x", 1, 0.3)
    assert r.wrk.responses == 3000 and r.wrk.rate == 1000
    assert r.wrk.errors == 11 and r.wrk.read_errors == 5
    assert (r.wrk.p50_us, r.wrk.p99_us, r.wrk.p999_us) == (1000, 4000, 9000)


def test_figures_take_medians_and_overhead_is_cpu_minus_the_app():
    figs = hello.figures(rounds("x", cpu_s=0.3), app_us=2.0)
    assert figs["rps"] == 500  # rates 1000, 500, 333: the median
    assert figs["cpu_us"] == pytest.approx(100)  # 0.9 CPU-s over 9000 responses
    assert figs["overhead_us"] == pytest.approx(98)
    assert figs["p999_ms"] == 9.0
    assert figs["errors"] == 33 and figs["closed"] == 15


def test_ratios_are_to_both_baselines_and_missing_ones_are_none():
    results = {"gunicorn": ("g", rounds("gunicorn", 0.6)),
               "forkserve-w0": ("f", rounds("forkserve-w0", 0.3, scale=0.5))}
    rows = {r["server"]: r for r in hello.summary(results, app_us=0.0)}
    assert rows["forkserve-w0"]["rps_vs_gunicorn"] == 2.0
    assert rows["forkserve-w0"]["overhead_vs_gunicorn"] == pytest.approx(0.5)
    assert rows["forkserve-w0"]["rps_vs_gevent-pywsgi"] is None
    page = hello.render_markdown(list(rows.values()), [("meinheld", "does not build")],
                                 [], {"title": "t", "date": "today"})
    assert "| forkserve-w0 | 1,000 | 2.00× | — |" in page
    assert "- `meinheld`: does not build" in page and "- **date**: today" in page


def test_unknown_server_names_are_refused(capsys):
    with pytest.raises(SystemExit) as exc:
        hello.parse_args(["--servers", "forkserve-w0,nginx"])
    assert exc.value.code == 2
    assert "unknown server(s) nginx" in capsys.readouterr().err
