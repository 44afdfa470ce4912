"""The byte layout of a forkserve store and the checks that guard it.

Pure: nothing here opens files. It packs and checks headers, says where each
region lies, frames records and hashes keys, so tests can drive it with
plain bytes.

Layout, format version 2 (integers little-endian)::

    0               header, HEADER.size (88) bytes
    88              records, one after another in the order given, each
                    varint(len(key)) key varint(len(value)) value
    data_end        the codec's schema (for codec "row": the field names,
                    once for the whole file), schema_size bytes
    tags_start      (8-byte aligned) nslots uint16: the hash table's tags;
                    0 marks an empty slot
    positions_start (8-byte aligned) nslots uint32, or uint64 when the
                    records end past 4 GiB (flag WIDE_POSITIONS): where the
                    record of each used slot starts
    trailer_start   TRAILER: END_MAGIC and the header's crc32 once more
    file_size

Why this shape (version 1 stored field names in every record and spent
32-48 bytes of index on each, which made a store 1.5-3x its CSV): records
carry no padding and no per-record offsets; the hash table is two parallel
arrays, 2 + 4 bytes a slot, at most MAX_LOAD full, so the index costs about
8 bytes a record (9.3 past 4 GiB). Iteration walks the records in order.

A key's probe starts at slot home(crc32(key)) and moves right (wrapping)
until an empty slot; a slot whose tag (low 16 bits of the crc32, 0 mapped to
1) matches has its record's key compared. The table always has an empty
slot (nslots > count), so every probe ends. Keys hash with zlib.crc32, which
is the same in every process and every Python (Python's own hash() of str is
randomized per process).
"""

import struct
import sys
import zlib
from typing import NamedTuple

__all__ = [
    "MAGIC", "VERSION", "HEADER", "TRAILER", "MAX_LOAD", "MAX_RECORDS", "REBUILD",
    "WIDE_POSITIONS", "StoreError", "StoreFormatError", "Layout",
    "key_bytes", "table_size", "home", "tag", "varint", "read_varint",
    "pack_header", "read_layout",
]

#: First bytes of every store. The high byte and the CR LF / ^Z pair catch
#: files mangled by text-mode transfers, as PNG's signature does.
MAGIC = b"\x89FSDB\r\n\x1a"
END_MAGIC = b"FSDB-END"
VERSION = 2

#: magic, version, flags, codec name, count, nslots, data_end, schema_size,
#: file_size, crc32 of the records, of the schema, of the index (tags and
#: positions), then the crc32 of the 84 bytes before it.
HEADER = struct.Struct("<8sII16sQQQQQIIII")
_HEADER_CRC_SPAN = HEADER.size - 4
TRAILER = struct.Struct("<8sI4x")

#: Header flag: slot positions are uint64 (records end past 4 GiB), not uint32.
WIDE_POSITIONS = 1

#: Highest share of slots in use. Linear probing at 0.75 costs 2.5 probes a
#: hit and 8.5 a miss on average (Knuth); a probe reads one uint16 tag, and
#: a key only when the tag matches. The table takes 8 bytes a record.
MAX_LOAD = 0.75

#: A store holds at most this many records (a safe bound on the build's
#: uint32 record numbers).
MAX_RECORDS = 2**32 - 2

#: What to do about a file that is not a usable store.
REBUILD = ("rebuild it from its source: python -m forkserve.store build DATA.csv "
           "--key COLUMN -o NEW.fsdb, or Store.from_csv(...) / Store.build(...)")


class StoreError(Exception):
    """A store could not be built, opened or read."""


class StoreFormatError(StoreError):
    """A file is not a usable store: foreign, truncated, damaged or another version."""


class Layout(NamedTuple):
    """Where everything lies in one store, read from its header."""

    codec: str
    count: int
    nslots: int
    wide: bool
    data_end: int
    schema_end: int
    tags_start: int
    positions_start: int
    trailer_start: int
    file_size: int
    data_crc: int
    schema_crc: int
    index_crc: int


def regions(nslots, data_end, schema_size, wide):
    """Return (tags_start, positions_start, trailer_start, file_size)."""
    schema_end = data_end + schema_size
    tags_start = schema_end + (-schema_end % 8)
    tags_end = tags_start + 2 * nslots
    positions_start = tags_end + (-tags_end % 8)
    trailer_start = positions_start + (8 if wide else 4) * nslots
    return tags_start, positions_start, trailer_start, trailer_start + TRAILER.size


def table_size(count):
    """Number of hash slots for count records: load at most MAX_LOAD, one slot free."""
    return max(count + 1, -(-count * 4 // 3))  # ceil(count / MAX_LOAD)


def home(crc, nslots):
    """The slot where a key with this crc32 starts its probe (Lemire's fastrange)."""
    return (crc * nslots) >> 32


def tag(crc):
    """The uint16 a slot keeps of its key's crc32; never 0, which marks empty."""
    return crc & 0xFFFF or 1


_ONE_BYTE = [bytes((number,)) for number in range(0x80)]


def varint(number):
    """Encode a non-negative int as LEB128: 7 bits a byte, low bits first."""
    if number < 0x80:
        return _ONE_BYTE[number]
    out = bytearray()
    while number >= 0x80:
        out.append(number & 0x7F | 0x80)
        number >>= 7
    out.append(number)
    return bytes(out)


def read_varint(buf, pos):
    """Decode the LEB128 number at buf[pos]; return (number, position after it)."""
    number = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        number |= (byte & 0x7F) << shift
        if byte < 0x80:
            return number, pos
        shift += 7
        if shift > 63:
            raise ValueError("a record length runs past 9 bytes")


def key_bytes(key):
    """The stored form of a key: str as UTF-8, bytes as they are.

    Undecodable bytes in a str key (U+DC80..U+DCFF from 'surrogateescape')
    map back to the raw bytes, so every key the store yields looks itself up.
    Returns None for a key that cannot be in a store.
    """
    if isinstance(key, str):
        try:
            return key.encode()
        except UnicodeEncodeError:
            try:
                return key.encode("utf-8", "surrogateescape")
            except UnicodeEncodeError:
                return None
    if isinstance(key, bytes):
        return bytes(key)
    return None


def pack_header(codec, count, nslots, data_end, schema_size, crcs):
    """Return (header bytes, trailer bytes); crcs is (records, schema, index)."""
    wide = positions_are_wide(data_end)
    file_size = regions(nslots, data_end, schema_size, wide)[3]
    head = HEADER.pack(MAGIC, VERSION, WIDE_POSITIONS if wide else 0, codec.encode("ascii"),
                       count, nslots, data_end, schema_size, file_size, *crcs, 0)
    header_crc = zlib.crc32(head[:_HEADER_CRC_SPAN])
    head = head[:_HEADER_CRC_SPAN] + struct.pack("<I", header_crc)
    return head, TRAILER.pack(END_MAGIC, header_crc)


def positions_are_wide(data_end):
    """True when slot positions need uint64: some record may start past 4 GiB."""
    return data_end > 2**32


def _version_problem(version):
    if version < VERSION:
        return (f"format version {version}, written by an older forkserve; this forkserve "
                f"reads version {VERSION} only (field names stored once, a smaller index): "
                f"{REBUILD}, and point the servers at the new file")
    return (f"format version {version}, written by a newer forkserve; this forkserve "
            f"reads version {VERSION}: upgrade forkserve, or {REBUILD}")


def read_layout(name, buf):
    """Check the header and trailer of buf (bytes-like) and return its Layout.

    Cheap whatever the size: reads the header and trailer. Raises
    StoreFormatError saying what is wrong and what to do; name is the path
    shown in the message.
    """
    def refuse(problem):
        return StoreFormatError(f"{name}: {problem}; {REBUILD}")

    if sys.byteorder != "little":
        raise StoreError("forkserve stores need a little-endian machine")
    size = len(buf)
    if size < 12:
        if size == 0:
            raise refuse("the file is empty, not a forkserve store")
        raise refuse(f"only {size} bytes, too short to be a forkserve store")
    magic, version = struct.unpack_from("<8sI", buf)
    if magic != MAGIC:
        raise refuse(f"not a forkserve store (it starts with {bytes(buf[:8])!r})")
    if version != VERSION:
        raise StoreFormatError(f"{name}: {_version_problem(version)}")
    if size < HEADER.size:
        raise refuse(f"only {size} bytes, too short to be a forkserve store")
    (_, _, flags, codec, count, nslots, data_end, schema_size, file_size,
     data_crc, schema_crc, index_crc, header_crc) = HEADER.unpack_from(buf)
    if zlib.crc32(buf[:_HEADER_CRC_SPAN]) != header_crc:
        raise refuse("the header is damaged (its checksum does not match)")
    if file_size != size:
        if size < file_size:
            raise refuse(f"truncated: the header says {file_size} bytes but the file has {size}")
        raise refuse(f"{size - file_size} bytes of trailing data after the store's {file_size}")
    wide = bool(flags & WIDE_POSITIONS)
    tags_start, positions_start, trailer_start, expected = regions(
        nslots, data_end, schema_size, wide)
    if (expected != file_size or nslots <= count or data_end < HEADER.size
            or count > MAX_RECORDS or wide != positions_are_wide(data_end)):
        raise refuse("the header's sizes do not add up")
    if TRAILER.unpack_from(buf, trailer_start) != (END_MAGIC, header_crc):
        raise refuse("the trailer is missing or does not match the header")
    return Layout(codec.rstrip(b"\0").decode("ascii", "replace"), count, nslots, wide,
                  data_end, data_end + schema_size, tags_start, positions_start,
                  trailer_start, file_size, data_crc, schema_crc, index_crc)
