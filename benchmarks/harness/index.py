"""benchmarks/README.md's table of scenarios, generated from the scenarios and
their results.

    python -m benchmarks.harness.index                                # print it
    python -m benchmarks.harness.index --write benchmarks/README.md   # replace it there

A scenario is a script in benchmarks/ that runs (`if __name__ ==
"__main__"`). Its row comes from the script itself: the first line of its
docstring says what it measures, the first `python ...` line in the
docstring is the command. Where the scenario wrote a result.json (the
harness's result schema, results.Result) under benchmarks/results/, the row
links it with its date and the load and CPU steal it ran under. A test fails
when the README's table differs from this rendering: after adding a
scenario, run the --write command.
"""

import argparse
import ast
import glob
import os

from benchmarks.harness.results import FILENAME, Result, replace_between, show_or_write
from benchmarks.harness.servers import HERE

__all__ = ["render", "replace_in", "scenarios"]

BEGIN = "<!-- scenarios: python -m benchmarks.harness.index --write benchmarks/README.md -->"
END = "<!-- end of scenarios -->"

#: scripts in benchmarks/ that render pages rather than measure
TOOLS = {"readme_table.py"}

#: the README section that discusses a scenario's figures
SECTIONS = {
    "run.py": "#what-runs",
    "hello.py": "#hello-world-the-servers-own-cost",
    "hotpath.py": "#where-forkserves-time-goes-per-request",
    "head_micro.py": "#where-forkserves-time-goes-per-request",
    "parser_micro.py": "#where-forkserves-time-goes-per-request",
    "store_cold.py": "#the-store-from-a-cold-page-cache",
    "cow_cost.py": "#plain-dicts-in-4-workers-what-the-copies-cost",
    "startup.py": "#start-and-reload-cost",
    "deploy_nginx.py": "#several-instances-behind-nginx",
    "store_size.py": "#the-store-file-against-its-csv",
    "store_raw.py": "#the-store-format-raw-before-and-after",
    "shared_store.py": "#several-instances-sharing-one-store-file",
    "http_throughput.py": "#http-path-beforeafter-throughput-and-the-rfc-corpus",
    "http_corpus.py": "#http-path-beforeafter-throughput-and-the-rfc-corpus",
    "accesslog.py": "#what-the-access-log-costs",
    "worker_gc.py": "#smaller-measurements",
    "report_time.py": "#smaller-measurements",
    "chaos.py": "#chaos-attacks-side-by-side",
    "memory_check.py": "#what---max-worker-memorys-check-costs",
    "balance.py": "#connections-per-worker-balance",
}


def scenarios(directory=HERE):
    """[(script, what it measures, command)] of every scenario, by name."""
    found = []
    for path in sorted(glob.glob(os.path.join(directory, "*.py"))):
        name = os.path.basename(path)
        with open(path, encoding="utf-8") as f:
            source = f.read()
        if name in TOOLS or '__name__ == "__main__"' not in source:
            continue
        doc = ast.get_docstring(ast.parse(source), clean=True) or ""
        summary = " ".join(doc.split("\n\n")[0].split())
        commands = [line.strip() for line in doc.splitlines() if line.strip().startswith("python")]
        if not summary or not commands:
            raise ValueError(f"benchmarks/{name}: a scenario's docstring starts with what it "
                             "measures and shows its command (an indented 'python ...' line)")
        command = " ".join(commands[0].split("  #")[0].split())
        found.append((name, summary.rstrip(":"), command))
    return found


def latest_results(results_dir=os.path.join(HERE, "results")):
    """{script: (Result, path relative to benchmarks/)} of the newest result.json of each."""
    latest = {}
    for path in glob.glob(os.path.join(results_dir, "**", FILENAME), recursive=True):
        result = Result.read(path)
        if result.scenario not in latest or result.date > latest[result.scenario][0].date:
            latest[result.scenario] = (result, os.path.relpath(path, HERE))
    return latest


def render(rows, results):
    lines = ["| scenario | what it measures | command | latest result |", "|---|---|---|---|"]
    for name, what, command in rows:
        section = SECTIONS.get(name)
        what = f"[{what}]({section})" if section else what
        if name in results:
            result, path = results[name]
            c = result.conditions
            latest = (f"[{result.date}]({path}), load {c['load_before']:.1f}, "
                      f"steal {c['steal']:.1%}")
        else:
            latest = "—"
        lines.append(f"| [{name}]({name}) | {what} | `{command}` | {latest} |")
    return lines


def replace_in(text, lines):
    """`text` with the table between BEGIN and END replaced by `lines`."""
    return replace_between(text, BEGIN, END, lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", metavar="README", help="replace the table in this file")
    args = parser.parse_args(argv)
    show_or_write(render(scenarios(), latest_results()), args.write, BEGIN, END)


if __name__ == "__main__":
    main()
