"""One result schema for every scenario: what ran, how to run it again, on
what machine and under which load, and its figures.

A scenario writes `result.json` in its output directory:

    {"scenario": "hello", "title": "hello world", "command": "python benchmarks/hello.py",
     "date": "2026-11-25 21:30 UTC", "machine": "2 × ..., Linux ...",
     "conditions": {"load_before": 1.02, "load_after": 2.3, "steal": 0.002},
     "versions": {"python": "3.12.1", ...},
     "rows": [{"server": "forkserve-w0", "rps": 19095.0, ...}, ...]}

`rows` are the scenario's figures, one dict per server (or mode, or tree),
the same columns as its CSV. Its Markdown page starts with the same
context (`render_meta`), so a figure quoted anywhere keeps the command that
reproduces it and the conditions it was measured in.
"""

import dataclasses
import datetime
import json
import os
import shlex
import sys

from benchmarks.harness.machine import Conditions, machine

__all__ = ["Result", "command_line", "render_meta", "replace_between", "run_meta",
           "show_or_write", "table", "write_result"]

FILENAME = "result.json"


def _now():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


@dataclasses.dataclass
class Result:
    """One run of one scenario."""

    scenario: str
    command: str
    rows: list
    title: str = ""
    date: str = dataclasses.field(default_factory=_now)
    machine: str = dataclasses.field(default_factory=machine)
    conditions: dict = dataclasses.field(default_factory=dict)
    versions: dict = dataclasses.field(default_factory=dict)
    #: what a reader needs besides the figures (e.g. where a converted result came from)
    note: str = ""

    @classmethod
    def measured(cls, scenario, command, rows, conditions: Conditions, **fields):
        return cls(scenario, command, rows, conditions=conditions.as_dict(), **fields)

    def write(self, out_dir):
        """Write result.json in ``out_dir``; its path."""
        path = os.path.join(out_dir, FILENAME)
        with open(path, "w", encoding="utf-8") as f:
            json.dump(dataclasses.asdict(self), f, indent=1, default=str)
            f.write("\n")
        return path

    @classmethod
    def read(cls, path):
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        known = {field.name for field in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"{path}: not a result.json of this harness (unknown keys "
                             f"{', '.join(unknown)}); run the scenario again to rewrite it")
        return cls(**data)


def command_line(script, argv=None):
    """The command that ran this scenario, as a reader would type it."""
    args = sys.argv[1:] if argv is None else argv
    return f"python benchmarks/{script} {shlex.join(args)}".strip()


def write_result(script, argv, rows, conditions, out, **fields):
    """Write a run of benchmarks/`script` (argv as given to its main) to
    `out`/result.json, `out` made if missing; its path."""
    os.makedirs(out, exist_ok=True)
    return Result.measured(script, command_line(script, argv), rows, conditions,
                           **fields).write(out)


def replace_between(text, begin, end, lines):
    """`text` with the lines between the marker lines `begin` and `end`
    replaced by `lines`: how a generated table is kept in a page."""
    start, stop = text.index(begin) + len(begin), text.index(end)
    return text[:start] + "\n" + "\n".join(lines) + "\n" + text[stop:]


def show_or_write(lines, path, begin, end):
    """Print a generated table, or with a `path`, replace it there between its markers."""
    if not path:
        print("\n".join(lines))
        return
    with open(path, encoding="utf-8") as f:
        text = f.read()
    with open(path, "w", encoding="utf-8") as f:
        f.write(replace_between(text, begin, end, lines))


def run_meta(title, started_at, command, conditions, found_versions, **more):
    """A run's context, as render_meta shows it: title, date, command, machine
    with the load average and steal, versions, then ``more`` (load, servers...)."""
    return {"title": title, "date": started_at.strftime("%Y-%m-%d %H:%M UTC"),
            "command": f"`{command}`", "machine": machine() + "; " + conditions.describe(),
            "versions": ", ".join(f"{k} {v}" for k, v in found_versions.items()), **more}


def render_meta(meta, default_title):
    """A results page's first lines: its title and the run's context (date, command,
    machine...), one item each."""
    return [f"# forkserve benchmark: {meta.get('title', default_title)}", "",
            *(f"- **{key}**: {value}" for key, value in meta.items() if key != "title"), ""]


#: the units a column may give a figure, and how it is shown
UNITS = {
    "": lambda v: _number(v),
    "MiB": lambda v: f"{_number(v / 2**20)} MiB",  # the value is in bytes
    "%": lambda v: f"{v:.0%}",  # the value is a fraction
    "×": lambda v: f"{v:.2f}×",
    "s": lambda v: f"{_number(v)} s",
    "ms": lambda v: f"{_number(v)} ms",
    "µs": lambda v: f"{_number(v)} µs",
}

#: the headers of the figures most scenarios have, where no columns are given
HEADERS = {"rps": "req/s", "p50_ms": "p50", "p99_ms": "p99", "p999_ms": "p99.9",
           "cpu_us": "CPU/req"}

#: a key's suffix gives its unit when its column does not
SUFFIXES = (("_ms", "ms"), ("_us", "µs"), ("_s", "s"), ("_seconds", "s"))


def _number(value):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, int) or abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:#.3g}"


def _cell(value, unit):
    if value is None or value == "":
        return "—"
    if isinstance(value, list):
        return ", ".join(_number(v) for v in value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return UNITS[unit](value)
    return str(value).replace("|", "\\|").replace("\n", " ")


def _unit(key):
    return next((unit for suffix, unit in SUFFIXES if key.endswith(suffix)), "")


def _numeric(rows, key):
    values = [row.get(key) for row in rows if row.get(key) not in (None, "")]
    return bool(values) and all(isinstance(v, (int, float, list)) and not isinstance(v, bool)
                                for v in values)


def table(rows, columns=()):
    """A Markdown table of a result's rows: `columns` (key, header[, unit]),
    or every key the rows have, in the order they first appear."""
    if not columns:
        keys = list(dict.fromkeys(key for row in rows for key in row))
        columns = [(key, HEADERS.get(key, key)) for key in keys]
    columns = [(c[0], c[1], c[2] if len(c) > 2 else _unit(c[0])) for c in columns]
    lines = ["| " + " | ".join(header for _, header, _ in columns) + " |",
             "|" + "|".join("---:" if _numeric(rows, key) else "---" for key, _, _ in columns)
             + "|"]
    for row in rows:
        lines.append("| " + " | ".join(_cell(row.get(key), unit) for key, _, unit in columns)
                     + " |")
    return lines
