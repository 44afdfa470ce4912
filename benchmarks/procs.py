"""Kept importable for scenarios not yet moved: use benchmarks.harness.procs."""

from benchmarks.harness.procs import *  # noqa: F401,F403
from benchmarks.harness.procs import __all__  # noqa: F401
