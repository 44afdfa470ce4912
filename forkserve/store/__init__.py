"""A compact, read-only mapping for big lookup datasets that forked workers share.

    store = Store.from_csv("people.csv", key="email", path="people.fsdb")
    store["ana@example.com"]        # a fresh dict, decoded on each lookup
    store.raw("ana@example.com")    # the row as JSON bytes, ready to send

Why: reading a Python object writes its reference count, so every worker
forked from a master that holds a dataset as dicts copies the pages it reads
(measured: ~70% of 200 MB per worker). A Store holds no Python object per
record. Its records are bytes in one buffer and its index is flat arrays in
the same buffer; a lookup reads them and builds only short-lived objects
(the key's bytes, the result), which die in the worker's own heap. Measured
with 200,000 ten-field records, a forked worker that looks up every record
keeps about 1 MB private (tests/test_store.py, memory mark).

Compact: with codec "row" (the default for CSV) the field names are stored
once per file and a record is its key and its field values; the file is at
most 1.2x the CSV it came from, index included (benchmarks/store_size.py).

File layout (details and the checks in forkserve.store.layout)::

    header    magic, format version, codec, counts, sizes, checksums
    records   varint key length, key, varint value length, value; in input order
    schema    what the codec keeps once (codec "row": the field names)
    tags      uint16 per hash slot: part of the key's crc32, 0 when empty
    positions uint32 (uint64 past 4 GiB) per hash slot: where its record starts
    trailer   end magic and the header's checksum again

Invariants:

- One contiguous buffer holds everything: header, records, schema, hash
  table, trailer (layout in forkserve.store.layout). The Store object itself
  is a handful of attributes, whatever the number of records.
- Opened from a file, the buffer is a read-only shared mmap: its pages are
  page cache, shared by every process that maps the file (workers, reload
  generations, other servers on the host), never copied, and opening costs
  the same for 1 KB or 10 GB. Built in memory, the buffer is a private
  anonymous mmap: after fork the pages stay shared until written, and
  nothing here writes them.
- A mapped file must never be rewritten in place: a reader would see pages
  change under it, and one truncated under it dies of SIGBUS. Builds write a
  temporary file and rename it over the target, so readers of the old file
  keep the old inode.
- Keys hash with zlib.crc32, identical in every process; records are found
  by comparing key bytes, never by Python's randomized hash().
- Lookups only read, so a Store is safe to use from any number of greenlets
  or threads at once. Closing it while a lookup runs is the caller's bug.
- Keys are unique: building with a duplicate raises StoreError naming both
  records (CSV: both lines). Iteration yields records in the order given.
- A file is refused on open (StoreFormatError) when its magic, version,
  header checksum, sizes, schema or trailer are wrong, so a foreign, old or
  truncated file is never read as data. The records are not checksummed on
  open, which would read the whole file; verify() does that on demand.
"""

import collections.abc
import contextlib
import mmap
import os
import zlib

from forkserve.store import build
from forkserve.store.csvrows import CsvRows
from forkserve.store.codecs import get_codec
from forkserve.store.layout import (
    HEADER, REBUILD, VERSION, StoreError, StoreFormatError, key_bytes, read_layout, read_varint,
)

__all__ = ["Store", "StoreError", "StoreFormatError"]

_MISSING = object()
#: prefetch's posix_fadvise(WILLNEED) step: Linux reads one read-ahead window per call at most
_PREFETCH_STEP = 128 * 1024


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
        name = path or "in-memory store"
        layout = read_layout(name, buffer)
        self._codec = get_codec(layout.codec)
        schema = buffer[layout.data_end:layout.schema_end]
        if zlib.crc32(schema) != layout.schema_crc:
            raise StoreFormatError(f"{name}: the codec's schema is damaged (checksum "
                                   f"mismatch); {REBUILD}")
        decoder = self._codec.decoder(schema, name)
        self._decode = decoder.decode
        self._encode_raw = decoder.raw
        self._fields = getattr(decoder, "names", None)
        self._layout = layout
        self._buf = buffer
        self._path = path
        view = memoryview(buffer)
        self._tags = view[layout.tags_start:layout.tags_start + 2 * layout.nslots].cast("H")
        self._positions = view[layout.positions_start:layout.trailer_start].cast(
            "Q" if layout.wide else "I")
        view.release()
        self._nslots = layout.nslots

    # -- making stores ---------------------------------------------------

    @classmethod
    def build(cls, rows, path=None, *, codec="json"):
        """Build a store from (key, value) pairs, or from a mapping's items.

        codec "json" takes any JSON value; "row" takes mappings with the same
        field names in every record and stores the names once.
        Rows are streamed: each is encoded, written and dropped. Without
        path the store lives in memory; with path it is written to that
        file (via a temporary file and a rename) and opened from it.
        """
        codec = get_codec(codec)
        if isinstance(rows, collections.abc.Mapping):
            rows = rows.items()
        return cls._build(rows, path, codec, build.describe_record)

    @classmethod
    def from_csv(cls, csv_path, key, path=None, *, codec="row", progress=None):
        """Build a store from a UTF-8 CSV file with a header line.

        Each row becomes {column: text} for every column, under the key
        found in column `key`. Codec "row" keeps the column names once in
        the file; codec "json" keeps each row as a JSON object (names in
        every record, ~1.5-3x bigger, raw() is then a plain slice). progress is None to log at INFO on the
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
    def open(cls, path, *, populate=False, prefetch=False):
        """Map the store file at path, checking only its header and trailer.

        Takes microseconds whatever the size; pages are read on first use,
        from disk if the page cache lacks them (a gevent worker waits with all
        its greenlets). prefetch=True queues reads of the file into the page
        cache and returns without waiting or mapping anything here.
        populate=True reads and maps every page before returning: in a
        pre-fork master, the workers' pages are then the master's too, shared
        (and counted as shared in /proc/PID/smaps), and no request waits for
        a fault; the master's RSS grows by the file: the one copy all use.
        Raises StoreFormatError for a file that is not a complete store.
        """
        path = os.fspath(path)
        flags = mmap.MAP_SHARED | (mmap.MAP_POPULATE if populate else 0)
        with open(path, "rb") as file:
            size = os.fstat(file.fileno()).st_size
            if size < HEADER.size:
                read_layout(path, file.read())  # raises, saying how short it is
            with contextlib.suppress(OSError):  # a hint: refused, the open stays lazy
                for offset in range(0, size if prefetch and not populate else 0, _PREFETCH_STEP):
                    os.posix_fadvise(file.fileno(), offset, _PREFETCH_STEP, os.POSIX_FADV_WILLNEED)
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
        """Return (key bytes, value start, value end), or None if key is absent.

        Probes from the key's home slot until an empty one; reads a record's
        key only when its slot carries the same tag.
        """
        if type(key) is str:  # the fast path; key_bytes() handles the rest
            try:
                key = key.encode()
            except UnicodeEncodeError:
                key = key_bytes(key)
        elif type(key) is not bytes:
            key = key_bytes(key)
        if key is None:
            return None
        crc = zlib.crc32(key)
        nslots = self._nslots
        i = (crc * nslots) >> 32  # layout.home()
        wanted = crc & 0xFFFF or 1  # layout.tag()
        tags = self._tags
        found = tags[i]
        probes = nslots
        while found:
            if found == wanted:
                buf = self._buf
                start = self._positions[i]
                length = buf[start]
                if length < 0x80:
                    start += 1
                else:
                    length, start = read_varint(buf, start)
                end = start + length
                if length == len(key) and buf[start:end] == key:
                    length = buf[end]
                    if length < 0x80:
                        return key, end + 1, end + 1 + length
                    high = buf[end + 1]
                    if high < 0x80:  # values of 128 bytes to 16 KiB: two bytes
                        return key, end + 2, end + 2 + (length & 0x7F | high << 7)
                    length, start = read_varint(buf, end)
                    return key, start, start + length
            i += 1
            if i == nslots:
                i = 0
            found = tags[i]
            probes -= 1
            if not probes:  # a built index is at most 75% full: never all tags set
                raise StoreFormatError(f"{self._name}: the hash index has no empty slot, so "
                                       f"the file is damaged; {REBUILD}")
        return None

    def _damaged(self, key, exc):
        """The error for a value that does not decode: the file is damaged."""
        return StoreFormatError(
            f"{self._name}: the value of {key.decode('utf-8', 'surrogateescape')!r} "
            f"does not decode as {self._codec.name} ({exc}), so the file is damaged; {REBUILD}")

    def __getitem__(self, key):
        value = self.get(key, _MISSING)
        if value is _MISSING:
            raise KeyError(key)
        return value

    def get(self, key, default=None):
        """Return the decoded value for key, or default."""
        found = self._find(key)
        if found is None:
            return default
        key, start, end = found
        try:
            return self._decode(self._buf[start:end], key)
        except (ValueError, IndexError) as exc:
            raise self._damaged(key, exc) from exc

    def raw(self, key):
        """Return the value as bytes to send without decoding it.

        For codec "json" these are the stored JSON bytes; for "row" the JSON
        object joined from the stored field bytes and the names (no decode,
        no encode; byte for byte orjson.dumps of the row); for the other
        codecs the stored bytes.
        """
        value = self.get_raw(key, _MISSING)
        if value is _MISSING:
            raise KeyError(key)
        return value

    def get_raw(self, key, default=None):
        """Return raw(key), or default if key is absent."""
        found = self._find(key)
        if found is None:
            return default
        key, start, end = found
        value = self._buf[start:end]
        if self._encode_raw is None:
            return value
        try:
            return self._encode_raw(value, key)
        except (ValueError, IndexError) as exc:
            raise self._damaged(key, exc) from exc

    def __contains__(self, key):
        return self._find(key) is not None

    def __len__(self):
        return self._layout.count

    def _walk(self):
        """Yield (key bytes, value start, value end) for every record, in order."""
        buf = self._buf
        pos = HEADER.size
        data_end = self._layout.data_end
        while pos < data_end:
            length, pos = read_varint(buf, pos)
            key = buf[pos:pos + length]
            length, pos = read_varint(buf, pos + length)
            yield key, pos, pos + length
            pos += length

    def __iter__(self):
        for key, _, _ in self._walk():
            yield key.decode("utf-8", "surrogateescape")

    def items(self):
        return _ItemsView(self)

    def values(self):
        return _ValuesView(self)

    def _records(self):
        """Yield (key, value) for every record, in order, without hashing."""
        buf = self._buf
        for key, start, end in self._walk():
            try:
                value = self._decode(buf[start:end], key)
            except (ValueError, IndexError) as exc:
                raise self._damaged(key, exc) from exc
            yield key.decode("utf-8", "surrogateescape"), value

    # -- about the store ---------------------------------------------------

    @property
    def codec(self):
        """Name of the value codec: "row", "json", "bytes", "str" or "msgpack"."""
        return self._codec.name

    @property
    def fields(self):
        """The field names every value has (codec "row"), or None for other codecs."""
        return self._fields

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
                ("index", layout.tags_start, layout.trailer_start, layout.index_crc)]:
            with memoryview(self._buf) as view, view[start:end] as region:
                if zlib.crc32(region) != expected:
                    raise StoreFormatError(f"{self._name}: the {what} are damaged "
                                           f"(checksum mismatch); {REBUILD}")

    def close(self):
        """Unmap the buffer. Later lookups raise ValueError, as a closed file's reads do."""
        if self._buf.closed:
            return
        self._tags.release()
        self._positions.release()
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
