"""The stats dashboard in a real headless Chromium, against a real server.

Skipped with the install command where chromium is absent, failed instead
when CI=true (.ci/run installs it). tests/chromium.py drives the browser.
"""

import json
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
    browser.pump(0.5)  # anything the last refresh logged
    assert browser.problems() == []
