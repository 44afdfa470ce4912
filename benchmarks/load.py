"""Kept importable for scenarios not yet moved: use benchmarks.harness.wrk."""

from benchmarks.harness.wrk import *  # noqa: F401,F403
from benchmarks.harness.wrk import LUA_SCRIPT, __all__  # noqa: F401
