"""The forkserve benchmark harness; run it with python benchmarks/run.py."""
