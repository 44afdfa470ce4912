"""Building one store file per shard, for instances that each serve one shard.

    forkserve store build people.csv --key email -o people.store --shards 3
    # people.shard0-of-3.store  people.shard1-of-3.store  people.shard2-of-3.store

Which shard a record goes to is forkserve.store.shards.shard_of(key, N),
the function nginx's split_clients computes (examples/deploy/nginx.conf).

Each shard is built by Store.build from the rows of its shard alone, read
in a pass over the CSV of its own: N passes, each holding one row at a time,
so memory stays what one build needs, and time is N times the parsing. The
first pass builds shard 0 and notes every row's shard (one small integer a
row), so each key is hashed once. Every shard file is written under a
temporary name and renamed when complete (Store.build's rule), so an
instance never maps half a shard. A malformed row stops the first pass,
which reads the whole file, before any shard file is complete; a duplicate
key stops the build of its shard (both copies of a key always fall in the
same shard).
"""

import os
from array import array

from forkserve.store import Store
from forkserve.store.csvrows import CsvRows
from forkserve.store.layout import StoreError
from forkserve.store.shards import shard_of, upper_bounds

__all__ = ["shard_path", "build_csv_shards"]


def shard_path(path, index, count):
    """people.store -> people.shard0-of-3.store (the suffix stays last)."""
    root, ext = os.path.splitext(os.fspath(path))
    return f"{root}.shard{index}-of-{count}{ext}"


def build_csv_shards(csv_path, key, path, count, *, codec="row", progress=None):
    """Build count store files from a CSV, split by shard_of(key); return their paths."""
    bounds = upper_bounds(count)
    placement = array("H")  # the shard of each row, in order, noted by the first pass

    def first_pass():
        for row in CsvRows(csv_path, key, progress):
            shard = shard_of(row[0], count, bounds=bounds)
            placement.append(shard)
            if shard == 0:
                yield row

    paths = []
    for index in range(count):
        target = shard_path(path, index, count)
        if index == 0:
            rows = first_pass()
        else:
            rows = _rows_of_shard(CsvRows(csv_path, key, _quiet), placement, index)
        try:
            Store.build(rows, target, codec=codec).close()
        except StoreError as exc:
            raise StoreError(f"{target} (shard {index} of {count}): {exc}; record numbers "
                             f"count this shard's rows only") from None
        paths.append(target)
    return paths


def _rows_of_shard(rows, placement, index):
    for number, row in enumerate(rows):
        if number >= len(placement):
            raise StoreError(f"{rows.path} grew while the shards were built; build again "
                             f"from a file that is not being written")
        if placement[number] == index:
            yield row


def _quiet(rows, bytes_read, total_bytes):
    """Progress is reported during the first pass only."""
