"""The stats dashboard in a real headless Chromium, against a real server.

Skipped with the install command where chromium is absent, failed instead
when CI=true (.ci/run installs it). tests/chromium.py drives the browser.
"""

import json
import math
import re

import pytest

import chromium
from forkserve_testing import poll

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

STATS = re.compile(r"Stats at: http://127\.0\.0\.1:(\d+)")

#: what the chart drew, per series: [label, kind, points]
LAYERS = ("JSON.stringify([...document.querySelectorAll('#memory path.layer')]"
          ".map(p => [p.dataset.series, p.dataset.kind, Number(p.dataset.points)]))")
MARKERS = ("JSON.stringify([...document.querySelectorAll('#memory line.marker')]"
           ".map(l => l.dataset.kind))")
#: what a reader sees: the sentence, the key, the table's swatches, the chart's
#: fills and its tick labels, and the largest total the chart has to hold
PAGE = """JSON.stringify({
  headline: document.getElementById('headline').textContent,
  status: document.getElementById('status').textContent,
  key: [...document.querySelectorAll('#key .entry')].map(e => [e.dataset.kind, e.textContent]),
  rows: [...document.querySelectorAll('#legend tbody tr')].map(r => [r.dataset.series,
    [...r.querySelectorAll('.swatch')].map(s => [s.dataset.kind,
                                                 getComputedStyle(s).backgroundColor])]),
  fills: [...document.querySelectorAll('#memory path.layer')].map(p => [p.dataset.series,
    p.dataset.kind, getComputedStyle(p).fill]),
  memory: [...document.querySelectorAll('#memory text.tick.value')].map(
    t => [Number(t.dataset.value), t.textContent]),
  times: [...document.querySelectorAll('#memory text.tick.time')].map(
    t => [Number(t.dataset.value), t.textContent]),
  rates: [...document.querySelectorAll('#rate text.tick.value')].map(
    t => [Number(t.dataset.value), t.textContent]),
  largest: Math.max(...state.points.map(p => Object.values(p.values).reduce(
    (sum, v) => sum + v[0] + v[1], 0))),
  maxRate: Math.max(0, ...state.points.map(p => p.rate || 0)),
})"""
UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}
SIZE = r"([\d.]+) (B|KiB|MiB|GiB)"
HEADLINE = re.compile(rf"(\d+) processes use {SIZE}: {SIZE} for one copy of the application, "
                      rf"{SIZE} more for each of (\d+) workers\.")
ROUND = (1, 2, 2.5, 5)


@pytest.fixture
def browser(tmp_path):
    executable = chromium.require(pytest)
    with chromium.Browser(executable, tmp_path / "profile", tmp_path / "chromium.log") as b:
        yield b


def test_dashboard_draws_every_worker_and_marks_a_recycle_without_console_errors(
        run_server, browser):
    server = run_server("-w", "2", "--max-requests", "60", "--stats", "127.0.0.1:0",
                        app="basic:app")
    old = set(server.wait_workers(2))
    port = int(poll(lambda: STATS.search(server.log()), message="the stats line").group(1))
    browser.open(f"http://127.0.0.1:{port}/")

    def drawn():
        layers = json.loads(browser.evaluate(LAYERS) or "[]")
        points = {(label, kind): count for label, kind, count in layers}
        wanted = [(label, kind) for label in ("master", "worker 1", "worker 2")
                  for kind in ("private", "shared")]
        return all(points.get(key, 0) >= 2 for key in wanted) and points
    poll(drawn, timeout=30, interval=0.2, message="the chart to have points for every worker")

    def recycled():  # --max-requests 60: a worker is replaced by one of the same number
        if set(server.children()) - old and len(server.children()) == 2:
            return True
        server.get("/")
        return False
    poll(recycled, timeout=60, message="a worker recycled by --max-requests")
    poll(lambda: "recycle" in json.loads(browser.evaluate(MARKERS) or "[]"), timeout=30,
         interval=0.2, message="a recycle marker on the chart")
    assert browser.evaluate("document.querySelector('#rate path.rate') !== null")
    assert browser.evaluate("document.getElementById('status').className") == ""

    def settled():  # a sample without the recycled worker draining beside its replacement
        page = json.loads(browser.evaluate(PAGE))
        found = HEADLINE.fullmatch(page["headline"])
        return found and found.group(1) == "3" and len(page["rows"]) == 3 and page
    page = poll(settled, timeout=60, interval=0.2, message="a sample of the master and 2 workers")
    check_headline(page)
    check_legend(page)
    check_ticks(page)
    browser.pump(0.5)  # anything the last refresh logged
    assert browser.problems() == []


def _bytes(number, unit):
    return float(number) * UNITS[unit]


def check_headline(page):
    """The sentence above the chart: the server's total first, then its parts,
    which add up to it; the total is the one the chart's last sample stacks."""
    found = HEADLINE.fullmatch(page["headline"])
    assert found, page["headline"]
    processes, total, total_unit, once, once_unit, each, each_unit, workers = found.groups()
    assert (processes, workers) == ("3", "2")
    total = _bytes(total, total_unit)
    parts = _bytes(once, once_unit) + 2 * _bytes(each, each_unit)
    assert abs(parts - total) <= 0.1 * UNITS[total_unit] + 0.1 * UNITS[each_unit] * 2
    status = re.search(rf"total PSS {SIZE}$", page["status"])
    assert abs(_bytes(*status.groups()) - total) <= 0.1 * UNITS[total_unit]


def check_legend(page):
    """The key names private and shared memory, and each process's row in the
    table shows the two shades the chart fills its private and shared layers with."""
    key = [(kind, " ".join(text.split())) for kind, text in page["key"]]
    assert key == [("private", "darker: private, memory the process alone holds"),
                   ("shared", "lighter: shared, its share of pages other processes map too")]
    fills = {(series, kind): fill for series, kind, fill in page["fills"]}
    assert [series for series, _ in page["rows"]] == ["master", "worker 1", "worker 2"]
    for series, swatches in page["rows"]:
        assert [kind for kind, _ in swatches] == ["private", "shared"]
        for kind, colour in swatches:
            assert colour == fills[series, kind], (series, kind)
        assert swatches[0][1] != swatches[1][1]


def check_round(values):
    """0, then evenly spaced steps of 1, 2, 2.5 or 5 times a power of ten."""
    assert values[0] == 0 and len(values) >= 2
    step = values[1]
    assert all(math.isclose(b - a, step) for a, b in zip(values, values[1:])), values
    mantissa = step / 10 ** math.floor(math.log10(step))
    assert any(math.isclose(mantissa, m) for m in ROUND), step


def check_ticks(page):
    """Each axis is labelled at round values a reader can read: sizes in one
    binary unit, request rates, clock times on round seconds or minutes."""
    labels = [label for _, label in page["memory"]]
    assert labels[0] == "0"
    sizes = [re.fullmatch(SIZE, label) for label in labels[1:]]
    assert all(sizes), labels
    units = {size.group(2) for size in sizes}
    assert len(units) == 1, labels
    unit = units.pop()
    numbers = [0.0] + [float(size.group(1)) for size in sizes]
    check_round(numbers)
    for (value, _), number in zip(page["memory"], numbers):
        assert math.isclose(value, number * UNITS[unit])
    top, below = page["memory"][-1][0], page["memory"][-2][0]
    assert below < page["largest"] <= top  # the chart's top is the first tick above it all
    rates = [value for value, _ in page["rates"]]
    check_round(rates)
    assert [label for _, label in page["rates"]] == [f"{r:g}" for r in rates]
    assert rates[-2] < max(1, page["maxRate"]) <= rates[-1]
    times = [value for value, _ in page["times"]]
    steps = {b - a for a, b in zip(times, times[1:])}
    assert len(steps) <= 1 and steps <= {1, 2, 5, 10, 15, 30, 60}, times  # a minute or two of samples
    for value, label in page["times"]:
        assert re.fullmatch(r"\d\d:\d\d:\d\d", label)
        assert not steps or int(label[-2:]) % min(steps) == 0, (label, steps)


def test_dashboard_axis_ticks_fall_on_round_values_of_one_unit(run_server, browser):
    server = run_server("-w", "1", "--stats", "127.0.0.1:0", app="basic:app")
    server.wait_workers(1)
    port = int(poll(lambda: STATS.search(server.log()), message="the stats line").group(1))
    browser.open(f"http://127.0.0.1:{port}/")
    poll(lambda: browser.evaluate("typeof byteTicks") == "function", timeout=30, interval=0.2,
         message="the dashboard's script")
    mib, gib = 2**20, 2**30
    cases = {  # the largest total: the labels of its axis
        215.6 * mib: ["0", "50 MiB", "100 MiB", "150 MiB", "200 MiB", "250 MiB"],
        693.2 * mib: ["0", "200 MiB", "400 MiB", "600 MiB", "800 MiB"],
        2.3 * gib: ["0", "0.5 GiB", "1 GiB", "1.5 GiB", "2 GiB", "2.5 GiB"],
        1020 * mib: ["0", "0.2 GiB", "0.4 GiB", "0.6 GiB", "0.8 GiB", "1 GiB"],
        40 * mib: ["0", "10 MiB", "20 MiB", "30 MiB", "40 MiB"],
        3000: ["0", "1 KiB", "2 KiB", "3 KiB"],
        1: ["0", "1 B"],
    }
    for largest, labels in cases.items():
        ticks = browser.evaluate(f"byteTicks({largest!r})")
        assert [label for _, label in ticks] == labels, largest
        assert ticks[-1][0] >= largest
    # five minutes of samples: a tick each minute, on the minute
    start = 1_764_100_000.5
    ticks = browser.evaluate(f"timeTicks({start}, {start + 300}, 6)")
    assert [t for t, _ in ticks] == [1_764_100_020 + 60 * i for i in range(5)]
    assert all(re.fullmatch(r"\d\d:\d\d", label) for _, label in ticks)
    assert browser.problems() == []
