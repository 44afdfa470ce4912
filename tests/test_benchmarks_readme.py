"""docs/benchmarks.md's benchmark table is made from the committed run's
summary.csv (benchmarks/readme_table.py), not typed in."""

from benchmarks import readme_table


def test_docs_benchmark_table_is_generated_from_the_committed_summary():
    with open(readme_table.PAGE, encoding="utf-8") as handle:
        text = handle.read()
    lines = readme_table.render(readme_table.read_summary())
    assert readme_table.replace_in(text, lines) == text, (
        "docs/benchmarks.md's table differs from benchmarks/results/summary.csv; run "
        "python -m benchmarks.readme_table --write docs/benchmarks.md")


def test_the_table_has_a_row_per_server_that_ran_with_ratios_to_gunicorn():
    rows = [
        {"server": "gunicorn", "status": "ok", "responses": "80000", "master_rss": str(2**30),
         "pss_final": str(2 * 2**30), "worker_private": str(2**28), "worker_file": "0",
         "rps": "2000", "cpu_us": "400", "p50_ms": "10", "p99_ms": "60", "p999_ms": "90",
         "ratio_pss_final": "1.0", "ratio_rps": "1.0"},
        {"server": "forkserve-share", "status": "ok", "responses": "80000",
         "master_rss": str(2**30), "pss_final": str(2**30), "worker_private": str(2**22),
         "worker_file": "0", "rps": "5000", "cpu_us": "190", "p50_ms": "5", "p99_ms": "20",
         "p999_ms": "30", "ratio_pss_final": "0.5", "ratio_rps": "2.5"},
        {"server": "uwsgi", "status": "skipped"},
    ]
    table = readme_table.render(rows)
    assert len(table) == 4 and "~80,000 lookups" in table[0]
    assert table[3] == ("| forkserve + `share()` | 1,024 MiB | 1,024 MiB (0.50×) | 4 MiB "
                        "| 0 MiB | 5,000 (2.50×) | 190 µs | 5.0 ms | 20.0 ms | 30.0 ms |")
