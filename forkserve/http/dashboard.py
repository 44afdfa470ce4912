"""The stats endpoint's live dashboard: one self-contained HTML page.

The page (dashboard.html, installed with the package) carries its own
script and style, loads nothing from elsewhere, and draws the history that
GET /history serves (forkserve.memory.history) as SVG: each process's
private and shared memory stacked over time, the request rate, and markers
for recycled workers and new generations. Above the chart, one sentence
says what the newest sample costs: the headline `forkserve memory` prints
(forkserve.memory.render.headline), served with the history. A key names
the darker shade of each process's colour private and the lighter shared,
and the axes are labelled at round values (0, 50, 100 MiB; 0, 0.5, 1 GiB;
round clock times).
"""

import functools
import importlib.resources

__all__ = ["page"]


@functools.cache
def page() -> bytes:
    """The dashboard's HTML (read from the package once)."""
    return importlib.resources.files(__package__).joinpath("dashboard.html").read_bytes()
