"""docs/benchmarks.md's benchmark table, made from a run's summary.csv.

    python -m benchmarks.readme_table                                # print it
    python -m benchmarks.readme_table --write docs/benchmarks.md     # replace it there

Reads benchmarks/results/summary.csv (what `python benchmarks/run.py`
writes; copy a run's results there to publish it) and renders one row per
server that ran: memory after the lookups, throughput and latency, each
with its ratio to Gunicorn. In docs/benchmarks.md the table sits between the
markers below; tests/test_benchmarks_readme.py fails when it differs from
what this renders from the committed summary.csv.
"""

import argparse
import csv
import os

from benchmarks.harness.results import replace_between, show_or_write

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SUMMARY = os.path.join(ROOT, "benchmarks", "results", "summary.csv")
PAGE = os.path.join(ROOT, "docs", "benchmarks.md")
BEGIN = "<!-- benchmark table: python -m benchmarks.readme_table --write docs/benchmarks.md -->"
END = "<!-- end of benchmark table -->"

#: the servers' names in the table, in the order of the run
NAMES = {
    "gunicorn": "Gunicorn `--preload -k gevent`",
    "gunicorn-gc": "Gunicorn + gc recipe in hooks",
    "uwsgi": "uWSGI (pyuwsgi, gevent loop)",
    "gevent-single": "one gevent WSGIServer process",
    "forkserve-dict": "forkserve, plain dicts",
    "forkserve-share": "forkserve + `share()`",
    "forkserve-store": "forkserve + store",
    "forkserve-single": "forkserve `-w 0`, plain dicts",
}


def _mib(value):
    return f"{float(value) / 2**20:,.0f} MiB" if value not in ("", None) else "—"


def _ratio(row, key):
    value = row.get(f"ratio_{key}", "")
    return f" ({float(value):.2f}×)" if value not in ("", None) else ""


def _ms(value):
    return f"{float(value):.1f} ms" if value not in ("", None) else "—"


def render(rows):
    """The table (markdown lines) for summary.csv's rows."""
    rows = [row for row in rows if row.get("status", "ok") == "ok"]
    lookups = round(min(int(row["responses"]) for row in rows), -3)
    lines = [
        f"| server | master RSS | total PSS after ~{lookups:,} lookups | private per worker "
        "| file per worker | req/s | CPU per request | p50 | p99 | p99.9 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        private = _mib(row.get("worker_private")) if row.get("worker_private") else "—"
        file_ = _mib(row.get("worker_file")) if row.get("worker_file") else "—"
        if row["server"] in ("gevent-single", "forkserve-single"):
            private = file_ = "—"  # one process: no workers
        lines.append(
            f"| {NAMES.get(row['server'], row['server'])} | {_mib(row['master_rss'])} "
            f"| {_mib(row['pss_final'])}{_ratio(row, 'pss_final')} | {private} | {file_} "
            f"| {float(row['rps']):,.0f}{_ratio(row, 'rps')} | {float(row['cpu_us']):.0f} µs "
            f"| {_ms(row['p50_ms'])} | {_ms(row['p99_ms'])} | {_ms(row.get('p999_ms'))} |")
    return lines


def read_summary(path=SUMMARY):
    with open(path, newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def replace_in(text, lines):
    """`text` with the table between BEGIN and END replaced by `lines`."""
    return replace_between(text, BEGIN, END, lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--summary", default=SUMMARY)
    parser.add_argument("--write", metavar="PAGE", help="replace the table in this file "
                        "(docs/benchmarks.md)")
    args = parser.parse_args(argv)
    show_or_write(render(read_summary(args.summary)), args.write, BEGIN, END)


if __name__ == "__main__":
    main()
