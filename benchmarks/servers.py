"""Kept importable for scenarios not yet moved: use benchmarks.harness.servers."""

from benchmarks.harness.servers import *  # noqa: F401,F403
from benchmarks.harness.servers import HERE, REPO, __all__, all_servers  # noqa: F401
