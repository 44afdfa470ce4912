"""Start PersonDB forkserve instances in store mode, for the store benchmarks.

Each instance is a separate `python -m forkserve` (its own master, as a
separate container or systemd unit would be) in its own process group,
bound to 127.0.0.1 port 0 (harness.start reads the port from its log).
`tree` is the source tree to run (the repository, or a checkout of an older
commit to compare against), put first on PYTHONPATH.
"""

import os
import sys

from benchmarks.harness.start import start

__all__ = ["start_persondb"]


def start_persondb(tree, *, workers, csv_path, store_path, log_path, cpus=None,
                   python=sys.executable, timeout=300):
    """forkserve -w workers on PersonDB (store mode) from `tree`, once ready: a harness Server."""
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONUNBUFFERED": "1",
           "PERSONDB_MODE": "store", "PERSONDB_CSV": str(csv_path),
           "PERSONDB_STORE": str(store_path)}
    env.pop("FORKSERVE_WORKERS", None)
    return start([python, "-m", "forkserve", "-w", str(workers), "-b", "127.0.0.1:0",
                  "examples.persondb.app:app"], log_path=log_path, env=env, cwd=str(tree),
                 cpus=cpus, processes=workers + 1, timeout=timeout)
