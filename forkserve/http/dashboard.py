"""The stats endpoint's live dashboard: one self-contained HTML page.

The page (dashboard.html, installed with the package) carries its own
script and style, loads nothing from elsewhere, and draws the history that
GET /history serves (forkserve.memory.history) as SVG: each process's
private and shared memory stacked over time, the request rate, and markers
for recycled workers and new generations.
"""

import functools
import importlib.resources

__all__ = ["page"]


@functools.cache
def page() -> bytes:
    """The dashboard's HTML (read from the package once)."""
    return importlib.resources.files(__package__).joinpath("dashboard.html").read_bytes()
