"""benchmarks/README.md and docs/benchmarks.md's table are generated from
the scenarios' docstrings and their result.json files
(benchmarks/harness/index.py), not typed in."""

import json
import pathlib

import pytest

from benchmarks.harness import index, results

ROOT = pathlib.Path(__file__).resolve().parent.parent

SCENARIO = '''"""Hello world on every server.

    python benchmarks/hello.py            # the full run

How it runs: one paragraph of method.
"""

RESULT_COLUMNS = (("server", "server"), ("rps", "req/s"), ("cpu_us", "CPU/req"))

if __name__ == "__main__":
    write_result("hello.py", [], [], None, "results/hello")
'''


def a_result(directory, date, rps, steal=0.01, scenario="hello.py",
             command="python benchmarks/hello.py --rounds 1"):
    directory.mkdir(parents=True)
    results.Result(scenario, command,
                   [{"server": "forkserve", "rps": rps, "cpu_us": 20.83}],
                   date=date, machine="2 × test CPU",
                   conditions={"load_before": 1.5, "load_after": 2.0, "steal": steal},
                   ).write(str(directory))


@pytest.fixture
def tree(tmp_path):
    (tmp_path / "hello.py").write_text(SCENARIO)
    a_result(tmp_path / "results" / "hello", "2026-11-23 17:28 UTC", 45490.5)
    a_result(tmp_path / "results" / "hello_quiet", "2026-11-25 22:50 UTC", 51000.0,
             steal=None)
    (tmp_path / "results" / "hello" / "results.md").write_text("# a page\n")
    (tmp_path / "results" / "stray.md").write_text("# measured by hand\n")
    return tmp_path


def test_benchmarks_readme_is_what_the_index_generates():
    text = (ROOT / "benchmarks" / "README.md").read_text(encoding="utf-8")
    assert text == index.readme(), (
        "benchmarks/README.md is stale: run python -m benchmarks.harness.index --write "
        "benchmarks/README.md (edit the scenarios' docstrings, not the README)")


def test_docs_benchmark_tables_are_generated_from_the_newest_results():
    text = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    for script, begin, end in index.DOCS_TABLES:
        assert begin in text and end in text, f"docs/benchmarks.md has no {script} table"
    assert index.docs_page(text) == text, (
        "docs/benchmarks.md's tables differ from the newest benchmarks/results/ of run.py "
        "and throughput.py; run python -m benchmarks.harness.index --docs docs/benchmarks.md")


def test_each_scenario_section_is_its_docstring_then_its_results_newest_first(tree):
    found = index.scenarios(str(tree))
    page = index.readme(found, index.results_by_scenario(str(tree / "results")),
                        index.result_files(str(tree / "results")))
    section = page[page.index("## hello.py"):]
    assert "    python benchmarks/hello.py            # the full run" in section
    assert "How it runs: one paragraph of method." in section
    newest, older = section.index("2026-11-25 22:50 UTC"), section.index("2026-11-23 17:28 UTC")
    assert newest < older
    assert "| server | req/s | CPU/req |" in section
    assert "| forkserve | 45,490 | 20.8 µs |" in section
    assert "`python benchmarks/hello.py --rounds 1`" in section
    assert "load average 1.50 before / 2.00 after; CPU steal 1.0%" in section
    assert "CPU steal not recorded" in section
    assert "[results/hello/results.md](results/hello/results.md)" in section
    assert "[2026-11-25 22:50 UTC](results/hello_quiet/result.json)" in page
    assert "- [results/stray.md](results/stray.md)" in page


def test_a_result_of_a_script_that_is_gone_is_still_listed(tree):
    a_result(tree / "results" / "old", "2026-11-20 10:00 UTC", 1.0, scenario="gone.py")
    page = index.readme(index.scenarios(str(tree)),
                        index.results_by_scenario(str(tree / "results")), [])
    assert "- [results/old/result.json](results/old/result.json)" in page


def test_a_file_belongs_to_the_longest_script_name_it_starts_with(tree):
    (tree / "hello_gc.py").write_text(SCENARIO.replace("Hello world on every server.",
                                                       "Hello world's collector."))
    (tree / "results" / "hello_gc_1").mkdir()
    (tree / "results" / "hello_gc_1" / "page.md").write_text("# gc\n")
    page = index.readme(index.scenarios(str(tree)), {},
                        index.result_files(str(tree / "results")))
    hello_gc = page[page.index("## hello_gc.py"):]
    hello = page[page.index("## hello.py"):page.index("## hello_gc.py")]
    assert "results/hello_gc_1/page.md" in hello_gc and "results/hello_gc_1" not in hello


def test_a_scenario_without_a_result_says_how_to_make_one(tree):
    found = index.scenarios(str(tree))
    page = index.readme(found, {}, [])
    assert "No result.json for this scenario" in page and "benchmarks/results/hello by default" in page


def test_a_scenario_that_writes_no_result_says_so(tmp_path):
    (tmp_path / "hello.py").write_text(SCENARIO.replace("write_result(", "print("))
    page = index.readme(index.scenarios(str(tmp_path)), {}, [])
    assert "This script does not write result.json yet" in page


def test_bad_result_columns_are_refused_with_the_form_they_take(tmp_path):
    (tmp_path / "bad.py").write_text(SCENARIO.replace('("cpu_us", "CPU/req")',
                                                      '("cpu_us", "CPU/req", "furlongs")'))
    with pytest.raises(ValueError, match="bad.py: RESULT_COLUMNS is a literal tuple"):
        index.scenarios(str(tmp_path))


def test_the_docs_table_has_a_row_per_server_that_ran(tmp_path):
    a_result(tmp_path / "run", "2026-11-23 18:21 UTC", 2000.0, scenario="run.py")
    path = tmp_path / "run" / "result.json"
    data = json.loads(path.read_text())
    data["rows"] += [{"server": "uwsgi", "status": "skipped", "rps": None}]
    path.write_text(json.dumps(data))
    run = index.Scenario("run.py", "PersonDB", "python benchmarks/run.py",
                         columns=(("server", "server"), ("rps", "req/s"),
                                  ("master_rss", "master RSS", "MiB")))
    lines = index.docs_table([run], index.results_by_scenario(str(tmp_path)))
    assert lines[0].startswith("Run of 2026-11-23 18:21 UTC ([result](../benchmarks/")
    assert "/run/result.json)" in lines[0] and "CPU steal 1.0%" in lines[0]
    assert lines[2] == "| server | req/s | master RSS |"
    assert lines[4:] == ["| forkserve | 2,000 | — |"]
    with pytest.raises(ValueError, match="no result.json of run.py"):
        index.docs_table([run], {})


def test_the_docs_table_is_the_newest_whole_run_not_a_partial_one(tmp_path):
    a_result(tmp_path / "whole", "2026-11-29 07:24 UTC", 2000.0, scenario="run.py",
             command="python benchmarks/run.py --python py")
    a_result(tmp_path / "c8", "2026-11-29 07:45 UTC", 3000.0, scenario="run.py",
             command="python benchmarks/run.py --servers forkserve --connections 8")
    run = index.Scenario("run.py", "PersonDB", "python benchmarks/run.py",
                         columns=(("server", "server"), ("rps", "req/s")))
    found = index.results_by_scenario(str(tmp_path))
    assert index.docs_table([run], found)[0].startswith("Run of 2026-11-29 07:24 UTC")
    del found["run.py"][1]  # only the partial run: it is shown, for want of a whole one
    assert index.docs_table([run], found)[0].startswith("Run of 2026-11-29 07:45 UTC")


def test_a_docs_table_of_a_run_on_a_busy_machine_says_so(tmp_path):
    a_result(tmp_path / "run", "2026-11-27 21:03 UTC", 2000.0, scenario="run.py")
    run = index.Scenario("run.py", "PersonDB", "python benchmarks/run.py",
                         columns=(("server", "server"), ("rps", "req/s")))
    found = index.results_by_scenario(str(tmp_path))
    assert "busy" not in index.docs_table([run], found)[0]  # load 2.0 on 2 CPUs
    found["run.py"][0][0].conditions["load_after"] = 24.57
    assert "busy (load average up to 25 on 2 CPUs)" in index.docs_table([run], found)[0]
