"""A compact, read-only mapping for big lookup datasets that forked workers share.

    store = Store.from_csv("people.csv", key="email", path="people.fsdb")
    store["ana@example.com"]        # a fresh dict, decoded on each lookup
    store.raw("ana@example.com")    # the stored JSON bytes, ready to send

Why: reading a Python object writes its reference count, so every worker
forked from a master that holds a dataset as dicts copies the pages it reads
(measured: ~70% of 200 MB per worker). A Store holds no Python object per
record. Its records are bytes in one buffer and its index is flat uint64
arrays in the same buffer; a lookup reads them and builds only short-lived
objects (the key's bytes, the result), which die in the worker's own heap.
Measured with 200,000 ten-field records: the store is 75 MB where the same
data as dicts grows the master by 197-214 MB, and a forked worker that looks
up every record keeps 1.1-1.3 MB private (tests/test_store.py, memory mark).

File layout (details and the checks in forkserve.store.layout)::

    header    magic, format version, codec, counts, sizes, checksums
    records   key bytes + value bytes, record after record, in input order
    offsets   uint64 per key start and value start, then the end
    slots     uint64 hash table: crc32(key) << 32 | record number + 1
    trailer   end magic and the header's checksum again

Invariants:

- One contiguous buffer holds everything: header, records, offsets, hash
  table, trailer (layout in forkserve.store.layout). The Store object itself
  is a handful of attributes, whatever the number of records.
- Opened from a file, the buffer is a read-only shared mmap: its pages are
  page cache, shared by every process that maps the file, never copied, and
  opening costs the same for 1 KB or 10 GB. Built in memory, the buffer is a
  private anonymous mmap: after fork the pages stay shared until written,
  and nothing here writes them.
- Keys hash with zlib.crc32, identical in every process; records are found
  by comparing key bytes, never by Python's randomized hash().
- Lookups only read, so a Store is safe to use from any number of greenlets
  or threads at once. Closing it while a lookup runs is the caller's bug.
- Keys are unique: building with a duplicate raises StoreError naming both
  records (CSV: both lines). Iteration yields records in the order given.
- A file is refused on open (StoreFormatError) when its magic, version,
  header checksum, sizes or trailer are wrong, so a foreign or truncated file
  is never read as data. The records are not checksummed on open, which
  would read the whole file; verify() does that on demand.
"""

import collections.abc
import mmap
import os
import zlib

from forkserve.store import build
from forkserve.store.csvrows import CsvRows
from forkserve.store.layout import (
    HEADER, REBUILD, VERSION, StoreError, StoreFormatError, get_codec, key_bytes, read_layout,
)

__all__ = ["Store", "StoreError", "StoreFormatError"]


class Store(collections.abc.Mapping):
    """A read-only mapping from str keys to values, packed in one buffer.

    Build one with Store.build() or Store.from_csv(), or open a file with
    Store.open(). Keys may be given as str or as UTF-8 bytes; iteration
    yields str (bytes that are not UTF-8 come back with surrogate escapes and
    still look themselves up). Each lookup decodes a new value, so callers
    may change what they get.
    """

    def __init__(self, buffer, path=None):
        """Wrap buffer (an mmap holding a store image). Prefer the classmethods."""
        layout = read_layout(path or "in-memory store", buffer)
        self._codec = get_codec(layout.codec)
        self._layout = layout
        self._buf = buffer
        self._path = path
        view = memoryview(buffer)
        self._offsets = view[layout.offsets_start:layout.slots_start].cast("Q")
        self._slots = view[layout.slots_start:layout.trailer_start].cast("Q")
        view.release()
        self._mask = layout.nslots - 1
        self._decode = self._codec.decode

    # -- making stores ---------------------------------------------------

    @classmethod
    def build(cls, rows, path=None, *, codec="json"):
        """Build a store from (key, value) pairs, or from a mapping's items.

        Rows are streamed: each is encoded, written and dropped. Without
        path the store lives in memory; with path it is written to that
        file (via a temporary file and a rename) and opened from it.
        """
        codec = get_codec(codec)
        if isinstance(rows, collections.abc.Mapping):
            rows = rows.items()
        return cls._build(rows, path, codec, build.describe_record)

    @classmethod
    def from_csv(cls, csv_path, key, path=None, *, codec="json", progress=None):
        """Build a store from a UTF-8 CSV file with a header line.

        Each row becomes {column: text} for every column, under the key
        found in column `key`. progress is None to log at INFO on the
        "forkserve.store" logger every few seconds, or a callable
        progress(rows_done, bytes_read, total_bytes), called every
        PROGRESS_EVERY rows and once at the end.
        """
        codec = get_codec(codec)
        rows = CsvRows(csv_path, key, progress)
        return cls._build(rows, path, codec, rows.describe)

    @classmethod
    def _build(cls, rows, path, codec, describe):
        if path is None:
            return cls._wrap(build.build_in_memory(rows, codec, describe), None)
        build.build_file(rows, codec, path, describe)
        return cls.open(path)

    @classmethod
    def open(cls, path, *, populate=False):
        """Map the store file at path, checking only its header and trailer.

        Takes microseconds whatever the size; pages are read on first use.
        With populate=True every page is read and mapped now (MAP_POPULATE):
        do that in a pre-fork master, so that the pages a worker touches are
        mapped by the master too — shared, and counted as shared in
        /proc/PID/smaps — and no request waits for a page fault. It costs the
        time to read the file (from the page cache, usually) and the master's
        RSS grows by the file's size: the one copy every worker uses.
        Raises StoreFormatError for a file that is not a complete store.
        """
        path = os.fspath(path)
        flags = mmap.MAP_SHARED | (mmap.MAP_POPULATE if populate else 0)
        with open(path, "rb") as file:
            if os.fstat(file.fileno()).st_size < HEADER.size:
                read_layout(path, file.read())  # raises, saying how short it is
            buffer = mmap.mmap(file.fileno(), 0, flags=flags, prot=mmap.PROT_READ)
        return cls._wrap(buffer, path)

    @classmethod
    def _wrap(cls, buffer, path):
        try:
            return cls(buffer, path)
        except BaseException:
            buffer.close()
            raise

    def save(self, path):
        """Write this store's image to path (same format; atomic replace)."""
        with build.atomic_file(path) as file:
            file.write(self._buf)

    # -- lookups ---------------------------------------------------------

    def _find(self, key):
        """Return the index in _offsets where key's value starts, or -1.

        Probes from slot crc32 & mask until an empty slot; reads a record's
        key bytes only when its slot carries the same crc32.
        """
        if type(key) is str:  # the fast path; key_bytes() handles the rest
            try:
                key = key.encode()
            except UnicodeEncodeError:
                key = key_bytes(key)
        elif type(key) is not bytes:
            key = key_bytes(key)
        if key is None:
            return -1
        crc = zlib.crc32(key)
        slots = self._slots
        mask = self._mask
        i = crc & mask
        entry = slots[i]
        while entry:
            if entry >> 32 == crc:
                start = 2 * (entry & 0xFFFFFFFF) - 2  # low half: record number + 1
                offsets = self._offsets
                if self._buf[offsets[start]:offsets[start + 1]] == key:
                    return start + 1
            i = (i + 1) & mask
            entry = slots[i]
        return -1

    def _value(self, key, where):
        offsets = self._offsets
        data = self._buf[offsets[where]:offsets[where + 1]]
        try:
            return self._decode(data)
        except ValueError as exc:
            raise StoreFormatError(
                f"{self._name}: the value of {key!r} does not decode as "
                f"{self._codec.name} ({exc}), so the file is damaged; {REBUILD}") from exc

    def __getitem__(self, key):
        where = self._find(key)
        if where < 0:
            raise KeyError(key)
        return self._value(key, where)

    def get(self, key, default=None):
        """Return the decoded value for key, or default."""
        where = self._find(key)
        return default if where < 0 else self._value(key, where)

    def raw(self, key):
        """Return the value's stored bytes (for codec "json", JSON to send as is)."""
        where = self._find(key)
        if where < 0:
            raise KeyError(key)
        offsets = self._offsets
        return self._buf[offsets[where]:offsets[where + 1]]

    def get_raw(self, key, default=None):
        """Return the value's stored bytes, or default."""
        where = self._find(key)
        if where < 0:
            return default
        offsets = self._offsets
        return self._buf[offsets[where]:offsets[where + 1]]

    def __contains__(self, key):
        return self._find(key) >= 0

    def __len__(self):
        return self._layout.count

    def __iter__(self):
        buf = self._buf
        offsets = self._offsets
        for i in range(0, 2 * self._layout.count, 2):
            yield buf[offsets[i]:offsets[i + 1]].decode("utf-8", "surrogateescape")

    def items(self):
        return _ItemsView(self)

    def values(self):
        return _ValuesView(self)

    def _records(self):
        """Yield (key, value) for every record, in order, without hashing."""
        for i, key in enumerate(self):
            yield key, self._value(key, 2 * i + 1)

    # -- about the store ---------------------------------------------------

    @property
    def codec(self):
        """Name of the value codec: "json", "bytes", "str" or "msgpack"."""
        return self._codec.name

    @property
    def path(self):
        """The file this store was opened from, or None if built in memory."""
        return self._path

    @property
    def nbytes(self):
        """Size of the whole image (records and index) in bytes."""
        return self._layout.file_size

    @property
    def _name(self):
        return self._path or "in-memory store"

    def verify(self):
        """Checksum every record and the index; raise StoreFormatError if damaged.

        Reads every page of the store (a 75 MB store takes ~0.03 s once
        cached), which is why open() does not.
        """
        layout = self._layout
        for what, start, end, expected in [
                ("records", HEADER.size, layout.data_end, layout.data_crc),
                ("index", layout.offsets_start, layout.trailer_start, layout.index_crc)]:
            with memoryview(self._buf) as view, view[start:end] as region:
                if zlib.crc32(region) != expected:
                    raise StoreFormatError(f"{self._name}: the {what} are damaged "
                                           f"(checksum mismatch); {REBUILD}")

    def close(self):
        """Unmap the buffer. Later lookups raise ValueError, as a closed file's reads do."""
        if self._buf.closed:
            return
        self._offsets.release()
        self._slots.release()
        self._buf.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    def __repr__(self):
        state = "closed" if self._buf.closed else f"{len(self)} records, {self.nbytes} bytes"
        return f"<Store {self._name!r} {state}, codec {self.codec!r}>"


class _ItemsView(collections.abc.ItemsView):
    def __iter__(self):
        return self._mapping._records()


class _ValuesView(collections.abc.ValuesView):
    def __iter__(self):
        for _, value in self._mapping._records():
            yield value


# -- command line ----------------------------------------------------------

def main(argv=None, prog="python -m forkserve.store"):
    """forkserve store build|info|get|shard: make and inspect store files."""
    import argparse
    import logging
    import sys

    parser = argparse.ArgumentParser(prog=prog, description=main.__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    build = commands.add_parser("build", help="build a store file from a CSV file")
    build.add_argument("csv", help="UTF-8 CSV file whose first line names the columns")
    build.add_argument("--key", required=True, help="column whose value is the lookup key")
    build.add_argument("-o", "--output", required=True, help="store file to write")
    build.add_argument("--codec", default="json", help="value codec (default: json)")
    build.add_argument("--shards", type=int, default=None, metavar="N",
                       help="write N files, OUTPUT with .shardI-of-N before its suffix, each "
                            "holding the keys of one shard (see the shard command)")
    info = commands.add_parser("info", help="describe a store file")
    info.add_argument("store")
    info.add_argument("--verify", action="store_true",
                      help="also checksum every record (reads the whole file)")
    get = commands.add_parser("get", help="print one record's stored bytes")
    get.add_argument("store")
    get.add_argument("key")
    shard = commands.add_parser("shard", help="say which of N shards keys belong to, or print "
                                "the nginx split_clients block that routes the same way")
    shard.add_argument("keys", nargs="*", metavar="KEY")
    shard.add_argument("--shards", type=int, required=True, metavar="N")
    shard.add_argument("--nginx", action="store_true",
                       help="print the nginx split_clients block for N shards")
    args = parser.parse_args(argv)

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from forkserve.store import shards, split
    try:
        if args.command == "shard":
            return _shard_command(args)
        if args.command == "build" and args.shards is not None:
            for path in split.build_csv_shards(args.csv, args.key, args.output, args.shards,
                                               codec=args.codec):
                with Store.open(path) as store:
                    print(f"{path}: {len(store)} records, {store.nbytes / 1e6:.1f} MB")
        elif args.command == "build":
            with Store.from_csv(args.csv, args.key, args.output, codec=args.codec) as store:
                print(f"{args.output}: {len(store)} records, {store.nbytes / 1e6:.1f} MB")
        elif args.command == "info":
            with Store.open(args.store) as store:
                print(_describe(store))
                if args.verify:
                    store.verify()
                    print(f"{'verified:':12}every record and the index match their checksums")
        else:
            with Store.open(args.store) as store:
                value = store.get_raw(args.key)
                if value is None:
                    print(f"{args.store}: no record for {args.key!r}", file=sys.stderr)
                    return 1
                sys.stdout.buffer.write(value + b"\n")
    except (StoreError, OSError, shards.ShardError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


def _shard_command(args):
    from forkserve.store import shards
    if args.nginx:
        print(shards.split_clients_block(args.shards), end="")
    bounds = shards.upper_bounds(args.shards)
    for key in args.keys:
        print(f"{shards.shard_of(key, args.shards, bounds=bounds)}\t{key}")
    if not args.keys and not args.nginx:
        raise shards.ShardError("give one or more keys, or --nginx for the split_clients block")
    return 0


def _describe(store):
    layout = store._layout
    count = len(store)
    records = layout.data_end - HEADER.size
    index = layout.trailer_start - layout.offsets_start
    lines = [
        ("path", store.path),
        ("format", f"forkserve store, version {VERSION}"),
        ("codec", store.codec),
        ("records", f"{count:,}"),
        ("size", f"{store.nbytes:,} bytes: {records:,} of records, {index:,} of index"),
        ("per record", f"{store.nbytes / max(count, 1):,.0f} bytes on average"),
        ("hash table", f"{layout.nslots:,} slots, {count / layout.nslots:.0%} in use"),
    ]
    return "\n".join(f"{label + ':':12}{value}" for label, value in lines)

