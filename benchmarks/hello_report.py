"""The hello-world benchmark's figures and page, from wrk's output: all pure.

Definitions are in benchmarks/hello.py's docstring.
"""

import dataclasses
import io
import statistics

from benchmarks.harness import wrk as load
from benchmarks.harness.results import render_meta

__all__ = ["BASELINES", "Round", "figures", "parse_wrk", "render_markdown", "summary"]

#: Ratios are given to each of these servers.
BASELINES = ("gunicorn", "gevent-pywsgi")


@dataclasses.dataclass(frozen=True)
class Round:
    """One wrk run against one server: wrk's figures and the server's CPU seconds."""

    server: str
    round: int
    wrk: load.PhaseResult
    cpu_s: float


def parse_wrk(stdout, server, round_no, cpu_s):
    """The Round from hello.lua's BENCH_RESULT line."""
    return Round(server, round_no, load.parse_result(stdout), cpu_s)


def figures(rounds, app_us):
    """One server's headline figures from its rounds (None = n/a)."""
    responses = sum(r.wrk.responses for r in rounds)
    cpu_us = sum(r.cpu_s for r in rounds) / responses * 1e6 if responses else None
    return {
        "rps": statistics.median(r.wrk.rate for r in rounds) if rounds else None,
        "p50_ms": statistics.median(r.wrk.p50_us for r in rounds) / 1000 if rounds else None,
        "p99_ms": statistics.median(r.wrk.p99_us for r in rounds) / 1000 if rounds else None,
        "p999_ms": statistics.median(r.wrk.p999_us for r in rounds) / 1000 if rounds else None,
        "cpu_us": cpu_us,
        "app_us": app_us,
        "overhead_us": cpu_us - app_us if cpu_us is not None and app_us is not None else None,
        "errors": sum(r.wrk.errors for r in rounds),
        "closed": sum(r.wrk.read_errors for r in rounds),
        "responses": responses,
        "rounds_rps": [round(r.wrk.rate) for r in rounds],
    }


def _ratio(value, base):
    return value / base if value is not None and base else None


def summary(results, app_us):
    """[{server, description, figures..., ratio_rps_<baseline>...}] for servers that ran."""
    rows = []
    figs = {name: figures(rounds, app_us) for name, (_, rounds) in results.items() if rounds}
    for name, (description, rounds) in results.items():
        if not rounds:
            continue
        row = {"server": name, "description": description, **figs[name]}
        for base in BASELINES:
            row[f"rps_vs_{base}"] = _ratio(row["rps"], figs.get(base, {}).get("rps"))
            row[f"overhead_vs_{base}"] = _ratio(row["overhead_us"],
                                                figs.get(base, {}).get("overhead_us"))
        rows.append(row)
    return rows


def _fmt(value, spec, suffix=""):
    return "—" if value is None else f"{value:{spec}}{suffix}"


def render_markdown(rows, skipped, notes, meta):
    out = io.StringIO()
    w = out.write
    render_meta(w, meta, "hello world")
    w("Ratios: req/s and server overhead relative to `gunicorn` and to `gevent-pywsgi` "
      "(— when that server did not run). Definitions: benchmarks/hello.py's docstring.\n\n")
    w("| server | req/s | ×gunicorn | ×gevent | p50 | p99 | p99.9 | CPU/req | app/req | "
      "server overhead/req | overhead ×gunicorn | overhead ×gevent | errors | "
      "closed by server | req/s per round |\n")
    w("|---|" + "---:|" * 14 + "\n")
    for r in rows:
        cells = [
            _fmt(r["rps"], ",.0f"), _fmt(r["rps_vs_gunicorn"], ".2f", "×"),
            _fmt(r["rps_vs_gevent-pywsgi"], ".2f", "×"),
            _fmt(r["p50_ms"], ".2f", " ms"), _fmt(r["p99_ms"], ".2f", " ms"),
            _fmt(r["p999_ms"], ".2f", " ms"),
            _fmt(r["cpu_us"], ",.1f", " µs"), _fmt(r["app_us"], ".2f", " µs"),
            _fmt(r["overhead_us"], ",.1f", " µs"),
            _fmt(r["overhead_vs_gunicorn"], ".2f", "×"),
            _fmt(r["overhead_vs_gevent-pywsgi"], ".2f", "×"),
            f"{r['errors']:,}", f"{r['closed']:,}",
            ", ".join(f"{x:,}" for x in r["rounds_rps"]),
        ]
        w(f"| `{r['server']}` | " + " | ".join(cells) + " |\n")
    w("\n")
    if skipped:
        w("## Not measured\n\n")
        for name, reason in skipped:
            w(f"- `{name}`: {reason}\n")
        w("\n")
    if notes:
        w("## Notes\n\n")
        for name, note in notes:
            w(f"- `{name}`: {note}\n")
        w("\n")
    return out.getvalue()
