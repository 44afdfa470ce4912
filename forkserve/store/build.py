"""Streaming rows into a store image: one pass in, one contiguous buffer out.

Invariants:

- Rows are consumed one at a time and dropped once written. Per record the
  builder keeps two uint64 offsets and a uint32 crc32 in arrays (20 bytes),
  then the hash table (16-32 bytes a record); never a dict of the keys or a
  list of the rows, so building a store of N records needs about N * 50
  bytes besides the image itself.
- The image is written front to back in the layout of forkserve.store.layout; only the
  header is written last, over the zeros reserved at offset 0.
- A file is built under a temporary name in the target's directory and
  renamed over the target only when complete and fsynced, so a reader sees
  the old store or the new one, never half of one. Processes that have the
  old file mapped keep reading the old data until they reopen.
- An in-memory image lives in a private anonymous mmap grown by mremap (no
  copy when it grows) and shrunk to size at the end: one buffer, returned to
  the OS whole when the store is closed.
"""

import contextlib
import errno
import mmap
import os
import tempfile
import zlib
from array import array

from forkserve.store.layout import (
    HEADER, MAX_RECORDS, StoreError, key_bytes, pack_header, table_size,
)

__all__ = ["build_in_memory", "build_file", "atomic_file", "describe_record"]

#: Errors fsync raises on a directory where the filesystem cannot sync one.
_DIRECTORY_FSYNC_UNSUPPORTED = {errno.EINVAL, errno.ENOTSUP}


def describe_record(number):
    """Name record `number` (counted from 0) for an error message."""
    return f"record {number + 1}"


def _as_bytes(items):
    return memoryview(items).cast("B")


def _show_key(data):
    return repr(data.decode("utf-8", "surrogateescape"))


class _MemorySink:
    """Writes into a private anonymous mmap, doubling it when full."""

    def __init__(self, capacity=1 << 20):
        self.buf = mmap.mmap(-1, capacity, flags=mmap.MAP_PRIVATE)
        self.pos = 0

    def write(self, data):
        end = self.pos + len(data)
        if end > len(self.buf):
            self.buf.resize(max(end, 2 * len(self.buf)))
        self.buf[self.pos:end] = data
        self.pos = end

    def write_at(self, offset, data):
        self.buf[offset:offset + len(data)] = data

    def read(self, start, end):
        return self.buf[start:end]


class _FileSink:
    """Writes through a buffered binary file opened for reading too."""

    def __init__(self, file):
        self.file = file
        self.pos = 0

    def write(self, data):
        self.file.write(data)
        self.pos += len(data)

    def write_at(self, offset, data):
        self.file.flush()
        os.pwrite(self.file.fileno(), data, offset)

    def read(self, start, end):
        self.file.flush()
        return os.pread(self.file.fileno(), end - start, start)


def _write_image(sink, rows, codec, describe):
    """Write a whole store image for rows into sink."""
    encode = codec.encode
    crc32 = zlib.crc32
    offsets = array("Q")
    hashes = array("I")
    sink.write(bytes(HEADER.size))
    pos = HEADER.size
    data_crc = 0
    for number, row in enumerate(rows):
        try:
            key, value = row
        except (TypeError, ValueError):
            raise StoreError(f"{describe(number)}: expected a (key, value) pair, "
                             f"got {type(row).__name__}") from None
        data = key_bytes(key)
        if data is None:
            raise StoreError(f"{describe(number)}: a key must be str or bytes, "
                             f"not {type(key).__name__}")
        try:
            encoded = encode(value)
        except (TypeError, ValueError, OverflowError) as exc:
            raise StoreError(f"{describe(number)}, key {_show_key(data)}: codec "
                             f"{codec.name!r} cannot encode the value: {exc}") from exc
        hashes.append(crc32(data))
        offsets.append(pos)
        offsets.append(pos + len(data))
        pos += len(data) + len(encoded)
        data_crc = crc32(encoded, crc32(data, data_crc))
        sink.write(data)
        sink.write(encoded)
    count = len(hashes)
    if count > MAX_RECORDS:
        raise StoreError(f"{count} records; a store holds at most {MAX_RECORDS}: split the data")
    offsets.append(pos)
    sink.write(bytes(-pos % 8))

    slots = _fill_table(hashes, offsets, sink.read, describe)
    del hashes
    index_crc = crc32(slots, crc32(offsets))
    sink.write(_as_bytes(offsets))
    sink.write(_as_bytes(slots))
    header, trailer = pack_header(codec.name, count, len(slots), pos, data_crc, index_crc)
    sink.write(trailer)
    sink.write_at(0, header)


def _fill_table(hashes, offsets, read, describe):
    """Return the slot array for records with these crc32s and offsets.

    Raises StoreError naming both records when two keys are equal: a
    duplicate is most often an error in the data, and keeping either one
    silently would hide it.
    """
    nslots = table_size(len(hashes))
    mask = nslots - 1
    slots = array("Q", [0]) * nslots
    for record, crc in enumerate(hashes):
        i = crc & mask
        entry = slots[i]
        while entry:
            if entry >> 32 == crc:
                other = (entry & 0xFFFFFFFF) - 1
                key = read(offsets[2 * record], offsets[2 * record + 1])
                if read(offsets[2 * other], offsets[2 * other + 1]) == key:
                    raise StoreError(
                        f"duplicate key {_show_key(key)}: {describe(other)} and "
                        f"{describe(record)}; keys must be unique, so remove or merge one")
            i = (i + 1) & mask
            entry = slots[i]
        slots[i] = (crc << 32) | (record + 1)
    return slots


def build_in_memory(rows, codec, describe=describe_record):
    """Return a private anonymous mmap holding the store image for rows."""
    sink = _MemorySink()
    try:
        _write_image(sink, rows, codec, describe)
        sink.buf.resize(sink.pos)
    except BaseException:
        sink.buf.close()
        raise
    return sink.buf


def build_file(rows, codec, path, describe=describe_record):
    """Write the store image for rows to path, atomically."""
    with atomic_file(path) as file:
        _write_image(_FileSink(file), rows, codec, describe)


@contextlib.contextmanager
def atomic_file(path):
    """Yield a binary file (w+b) that replaces path only if the block completes.

    The file gets mode 0644 rather than mkstemp's 0600: workers may run as
    another user than the process that builds the store.
    """
    directory, name = os.path.split(os.path.abspath(os.fspath(path)))
    fd, temporary = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory)
    try:
        with open(fd, "w+b") as file:
            yield file
            file.flush()
            os.fchmod(file.fileno(), 0o644)
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
    _fsync_directory(directory)


def _fsync_directory(directory):
    """Make the rename durable: sync the directory entry too."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in _DIRECTORY_FSYNC_UNSUPPORTED:
            raise
    finally:
        os.close(fd)
