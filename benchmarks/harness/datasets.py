"""The PersonDB dataset the scenarios load: generated once, cached by size and seed."""

import os
import subprocess
import time

from benchmarks.harness.machine import say
from benchmarks.harness.servers import REPO
from examples.persondb import generate

__all__ = ["build_store", "prepare_dataset"]


def prepare_dataset(rows, seed, data_dir):
    """The cached CSV and the emails file for wrk, generated when missing."""
    os.makedirs(data_dir, exist_ok=True)
    stem = os.path.join(data_dir, f"persondb-{rows}rows-seed{seed}")
    csv_path, emails_path = stem + ".csv", stem + ".emails"
    if not os.path.exists(csv_path):
        say(f"generating {rows:,} rows into {csv_path} (cached for later runs)")
        generate.generate_file(csv_path, rows, seed,
                               progress=lambda n: say(f"  {n:,} rows"))
    if not os.path.exists(emails_path):
        generate.generate_file(emails_path, rows, seed, only_emails=True)
    return csv_path, emails_path


def build_store(python, csv_path, env):
    """Build the Store cache once, outside any timed server start:
    (seconds, None), or (None, why it failed)."""
    started = time.monotonic()
    proc = subprocess.run(
        [python, "-c", "import examples.persondb.app"], cwd=REPO, capture_output=True,
        text=True, env=dict(env, PERSONDB_MODE="store", PERSONDB_CSV=csv_path), timeout=600,
    )
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines()
        return None, lines[-1] if lines else f"exit status {proc.returncode}"
    return time.monotonic() - started, None
