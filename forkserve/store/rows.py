"""Codec "row": table rows whose field names are stored once per file.

A value is a mapping with the same field names in every record (a CSV row).
The names, in the first row's order, go into the file's schema once; a
record keeps only its field values:

    flags (1 byte) [tags: 1 byte per stored field, if flags & TAGGED]
    body 0 \\x1f body 1 \\x1f ... \\x1f body n-1

- A str field is stored as the inside of its JSON string: its UTF-8 bytes
  when it needs no JSON escape (tag PLAIN, nearly always), else orjson's
  escaped form without the quotes (tag ESCAPED). Any other value is stored
  as its JSON text (tag LITERAL). Records whose fields are all PLAIN carry
  no tags (flags & TAGGED clear).
- None of these bodies can contain a byte below 0x20: JSON escapes control
  characters inside strings and writes none outside them. So 0x1f (ASCII's
  unit separator) divides the bodies unambiguously, and one bytes.split()
  in C finds them all: no per-field offsets.
- The key field, the first field whose value equals the record's key in the
  first row (a CSV's key column), is not stored again: the key is already in
  the record. A record whose key field differs from its key sets KEY_STORED
  and keeps it.

raw() needs no decoding: for an all-PLAIN record the JSON object is one
bytes.join of pieces made once from the names ('{"email":"', '","name":"',
'"}') and the bodies as they are stored, all in C (split, a list slice
assignment, join); the result is byte for byte orjson.dumps(dict(row)).
"""

import collections.abc
import operator
import re

import orjson

from forkserve.store.layout import StoreFormatError

__all__ = ["RowCodec", "SEPARATOR", "PLAIN", "ESCAPED", "LITERAL", "KEY_STORED", "TAGGED"]

SEPARATOR = b"\x1f"
PLAIN, ESCAPED, LITERAL = 0, 1, 2
#: Record flags.
KEY_STORED, TAGGED = 1, 2

#: Bytes that a JSON string must escape.
_NEEDS_ESCAPE = re.compile(rb'["\\\x00-\x1f]')
#: Maps every byte that a JSON string must escape, except the separator, to
#: '"': one translate and one `in` check a joined row in C (a regex search
#: takes ~10x as long on a 1 KB row).
_ESCAPES_TO_QUOTE = bytes.maketrans(bytes(range(0x1f)) + b"\\", b'"' * 0x20)

_VARYING = "use codec 'json' for values whose fields vary"


class RowCodec:
    """The "row" codec: hands out a RowEncoder per build, a RowDecoder per store."""

    name = "row"

    def encoder(self):
        return RowEncoder()

    def decoder(self, schema, path):
        try:
            described = orjson.loads(schema)
            names, key_field = described["fields"], described["key_field"]
            if not (isinstance(names, list) and all(isinstance(name, str) for name in names)
                    and (key_field is None or 0 <= key_field < len(names))):
                raise ValueError("unexpected field list")
        except (ValueError, TypeError, KeyError) as exc:
            raise StoreFormatError(f"{path}: the field names of codec 'row' do not read "
                                   f"({exc}), so the file is damaged") from None
        return RowDecoder(names, key_field)


class RowEncoder:
    """Encodes the rows of one build; learns the field names from the first."""

    def __init__(self):
        self.names = None
        self.key_field = None

    def schema(self):
        return orjson.dumps({"fields": self.names or [], "key_field": self.key_field})

    def _learn(self, key, value):
        names = list(value)
        bad = [name for name in names if not isinstance(name, str)]
        if bad:
            raise TypeError(f"codec 'row' needs str field names, not {type(bad[0]).__name__}")
        self.names = names
        self._known = frozenset(names)
        if len(names) > 1:
            self._fields = operator.itemgetter(*names)
        else:
            self._fields = lambda value: tuple(value[name] for name in names)
        if _NEEDS_ESCAPE.search(key):
            return
        for i, name in enumerate(names):
            field = value[name]
            if type(field) is str and field.encode("utf-8", "surrogatepass") == key:
                self.key_field = i
                return

    def encode(self, key, value):
        if not isinstance(value, collections.abc.Mapping):
            raise TypeError(f"codec 'row' needs a mapping of field names to values, "
                            f"not {type(value).__name__}")
        if self.names is None:
            self._learn(key, value)
        try:
            fields = self._fields(value)
        except KeyError as exc:
            raise ValueError(f"it has no field {exc.args[0]!r}, which the first row has; "
                             f"{_VARYING}") from None
        if len(value) != len(fields):
            extra = ", ".join(repr(name) for name in value if name not in self._known)
            raise ValueError(f"it has fields the first row has not: {extra}; {_VARYING}")
        k = self.key_field
        elided = (k is not None and type(fields[k]) is str and fields[k].encode() == key
                  and not _NEEDS_ESCAPE.search(key))
        stored = fields[:k] + fields[k + 1:] if elided else fields
        # The usual row: every field a str that needs no JSON escape. Three C
        # calls encode it; separators inside a field show up in the count.
        try:
            data = "\x1f".join(stored).encode()
        except TypeError:  # a field that is not a str
            data = None
        if (data is not None and b'"' not in data.translate(_ESCAPES_TO_QUOTE)
                and data.count(SEPARATOR) == max(len(stored) - 1, 0)):
            return (b"\x00" if elided or k is None else b"\x01") + data
        tags, bodies = _tagged(stored)
        flags = TAGGED if elided or k is None else TAGGED | KEY_STORED
        return bytes([flags, *tags]) + SEPARATOR.join(bodies)


def _tagged(fields):
    """Return (tags, bodies) for fields that are not all plain str."""
    tags, bodies = [], []
    for field in fields:
        if isinstance(field, str):
            body = field.encode()
            if _NEEDS_ESCAPE.search(body):
                tags.append(ESCAPED)
                body = orjson.dumps(field)[1:-1]
            else:
                tags.append(PLAIN)
        else:
            tags.append(LITERAL)
            body = orjson.dumps(field)
        bodies.append(body)
    return tags, bodies


class RowDecoder:
    """Turns the records of one store back into dicts, or into JSON bytes."""

    def __init__(self, names, key_field):
        self.names = tuple(names)
        self.key_field = key_field
        self._count = len(names)
        self._prefixes = [orjson.dumps(name) + b":" for name in names]
        # The JSON of an all-PLAIN record is b"".join(parts) once the bodies
        # fill parts[1::2]: '{"email":"', body, '","name":"', body, '"}'.
        between = [b"{}"]
        if names:
            between = [b'",' + prefix + b'"' for prefix in self._prefixes] + [b'"}']
            between[0] = b"{" + between[0][2:]
        self._parts = [piece for text in between for piece in (text, None)][:-1]
        self._shapes = (self._stored(0), self._stored(KEY_STORED))

    def _stored(self, flags):
        """(number of fields the record stores, whether its key field was left out)."""
        elided = self.key_field is not None and not flags & KEY_STORED
        return self._count - elided, elided

    def decode(self, data, key):
        flags = data[0]
        if flags & TAGGED:
            return dict(zip(self.names, [_value(tag, body)
                                         for tag, body in self._tagged(data, key, flags)]))
        stored, elided = self._shapes[flags]
        values = data[1:].decode().split("\x1f") if stored else []
        if len(values) != stored:
            raise _miscount(len(values), stored)
        if elided:
            values.insert(self.key_field, key.decode())
        return dict(zip(self.names, values))

    def raw(self, data, key):
        flags = data[0]
        if flags & TAGGED:
            return b"{" + b",".join(
                prefix + (body if tag == LITERAL else b'"' + body + b'"')
                for prefix, (tag, body) in zip(self._prefixes, self._tagged(data, key, flags))
            ) + b"}"
        stored, elided = self._shapes[flags]
        bodies = data[1:].split(SEPARATOR) if stored else []
        if len(bodies) != stored:
            raise _miscount(len(bodies), stored)
        if elided:
            bodies.insert(self.key_field, key)
        parts = self._parts[:]
        parts[1::2] = bodies
        return b"".join(parts)

    def _tagged(self, data, key, flags):
        """[(tag, body)] for every field of a record that carries tags."""
        stored, elided = self._stored(flags)
        tags = data[1:1 + stored]
        bodies = data[1 + stored:].split(SEPARATOR) if stored else []
        if len(bodies) != stored:
            raise _miscount(len(bodies), stored)
        pairs = list(zip(tags, bodies))
        if elided:
            pairs.insert(self.key_field, (PLAIN, key))
        return pairs


def _miscount(found, expected):
    return ValueError(f"{found} fields where the record should hold {expected}")


def _value(tag, body):
    if tag == PLAIN:
        return body.decode()
    if tag == ESCAPED:
        return orjson.loads(b'"' + body + b'"')
    if tag == LITERAL:
        return orjson.loads(body)
    raise ValueError(f"unknown field tag {tag}")
