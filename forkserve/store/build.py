"""Streaming rows into a store image: one pass in, one contiguous buffer out.

Invariants:

- Rows are consumed one at a time and dropped once written. Per record the
  builder keeps a uint64 position and a uint32 crc32 in arrays (12 bytes),
  then the hash table with a uint32 owner per slot (14-18 bytes a record);
  never a dict of the keys or a list of the rows, so building a store of N
  records needs about N * 30 bytes besides the image itself.
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
    HEADER, MAX_RECORDS, StoreError, home, key_bytes, pack_header, positions_are_wide,
    read_varint, table_size, tag, varint,
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
    encoder = codec.encoder()
    encode = encoder.encode
    crc32 = zlib.crc32
    positions = array("Q")
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
            encoded = encode(data, value)
        except (TypeError, ValueError, OverflowError) as exc:
            raise StoreError(f"{describe(number)}, key {_show_key(data)}: codec "
                             f"{codec.name!r} cannot encode the value: {exc}") from exc
        record = b"".join((varint(len(data)), data, varint(len(encoded)), encoded))
        hashes.append(crc32(data))
        positions.append(pos)
        pos += len(record)
        data_crc = crc32(record, data_crc)
        sink.write(record)
    count = len(hashes)
    if count > MAX_RECORDS:
        raise StoreError(f"{count} records; a store holds at most {MAX_RECORDS}: split the data")
    schema = encoder.schema()
    sink.write(schema)
    sink.write(bytes(-sink.pos % 8))

    tags, slots = _fill_table(hashes, positions, positions_are_wide(pos), sink.read, describe)
    del hashes, positions
    tags_bytes = _as_bytes(tags)
    index_crc = crc32(tags_bytes)
    sink.write(tags_bytes)
    padding = bytes(-sink.pos % 8)
    index_crc = crc32(_as_bytes(slots), crc32(padding, index_crc))
    sink.write(padding)
    sink.write(_as_bytes(slots))
    header, trailer = pack_header(codec.name, count, len(tags), pos, len(schema),
                                  (data_crc, crc32(schema), index_crc))
    sink.write(trailer)
    sink.write_at(0, header)


def _key_at(read, position):
    """The key of the record starting at position, read back from the sink."""
    head = read(position, position + 10)
    length, start = read_varint(head, 0)
    return read(position + start, position + start + length)


def _fill_table(hashes, positions, wide, read, describe):
    """Return (tags, positions by slot) for records with these crc32s and positions.

    Raises StoreError naming both records when two keys are equal: a
    duplicate is most often an error in the data, and keeping either one
    silently would hide it. While filling, a uint32 per slot remembers its
    record, so only records with the same full crc32 have their keys read.
    """
    nslots = table_size(len(hashes))
    tags = array("H", bytes(2 * nslots))
    slots = array("Q" if wide else "I", bytes((8 if wide else 4) * nslots))
    owners = array("I", bytes(4 * nslots))
    for record, crc in enumerate(hashes):
        i = home(crc, nslots)
        owner = owners[i]
        while owner:
            other = owner - 1
            if hashes[other] == crc:
                key = _key_at(read, positions[record])
                if _key_at(read, positions[other]) == key:
                    raise StoreError(
                        f"duplicate key {_show_key(key)}: {describe(other)} and "
                        f"{describe(record)}; keys must be unique, so remove or merge one")
            i += 1
            if i == nslots:
                i = 0
            owner = owners[i]
        owners[i] = record + 1
        tags[i] = tag(crc)
        slots[i] = positions[record]
    return tags, slots


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
