"""Which shard a key belongs to: one answer, in forkserve and in nginx.

    shard_of("ana@example.com", 3)     # 0, 1 or 2, the same everywhere
    split_clients_block(3)             # the nginx block that routes the same way

The function is nginx's `split_clients` applied to the key, so that nginx
routes every request to the instance holding its key with no module and no
script, and `forkserve store build --shards N` puts each record in the file
that instance serves:

1. hash the key's UTF-8 bytes with MurmurHash2 as nginx implements it
   (ngx_murmur_hash2: seed 0, little-endian words; 32-bit result);
2. cut the hash range 0..2**32-1 into `count` parts in the order given,
   each `10000 // count` hundredths of a percent wide, the last taking the
   rest (nginx's `*`); part i ends below sum(widths[:i+1]) * 0xFFFFFFFF //
   10000, each width rounded down as nginx rounds it.

nginx's documentation states the arithmetic (0.5% covers hashes 0 to
21474835), and tests/test_deploy_nginx.py asks a real nginx for the shard
of a thousand keys and compares.

Invariants:

- Pure integer arithmetic on bytes: the same shard for a key on every
  Python version, in every process, on every machine. Never Python's
  hash(), which is randomized per process for str and bytes.
- A key given as str is hashed as its UTF-8 bytes (surrogate escapes map
  back to raw bytes, as in a store), bytes as they are: "é" and b"\\xc3\\xa9"
  are the same key.
- Changing the number of shards moves most keys (this is range
  partitioning, not consistent hashing): resharding means rebuilding every
  shard file and the nginx block together.
"""

__all__ = ["MAX_SHARDS", "ShardError", "murmur2", "part_widths", "cumulative_bounds",
           "upper_bounds", "shard_of",
           "parse_shard", "split_clients_block"]

#: nginx gives each split_clients part a whole number of hundredths of a
#: percent, so 10,000 shards is the most it can express.
MAX_SHARDS = 10_000

_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


class ShardError(ValueError):
    """A shard count or a shard spec that cannot be used; the message says why."""


def murmur2(data: bytes) -> int:
    """nginx's ngx_murmur_hash2 of data: MurmurHash2, seed 0, as an int in 0..2**32-1."""
    length = len(data)
    h = length & _MASK
    whole = length - length % 4
    for i in range(0, whole, 4):
        k = int.from_bytes(data[i:i + 4], "little")
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    tail = data[whole:]
    if tail:
        h ^= int.from_bytes(tail, "little")
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h


def _check_count(count):
    if isinstance(count, bool) or not isinstance(count, int):
        raise ShardError(f"the number of shards must be a whole number, not {count!r}")
    if not 1 <= count <= MAX_SHARDS:
        raise ShardError(f"the number of shards must be between 1 and {MAX_SHARDS}, "
                         f"not {count}")


def part_widths(count):
    """The width of each of the first count-1 parts, in hundredths of a percent.

    The last part is nginx's `*`: whatever remains.
    """
    _check_count(count)
    return [10000 // count] * (count - 1)


def cumulative_bounds(widths):
    """nginx's arithmetic: the first hash past each part, for widths in 1/100 of a percent."""
    bounds = []
    last = 0
    for width in widths:
        last += width * _MASK // 10000
        bounds.append(last)
    return bounds


def upper_bounds(count):
    """For each shard but the last, the first hash value that is past it."""
    return cumulative_bounds(part_widths(count))


def _key_bytes(key):
    if isinstance(key, str):
        return key.encode("utf-8", "surrogateescape")
    if isinstance(key, (bytes, bytearray, memoryview)):
        return bytes(key)
    raise ShardError(f"a key must be str or bytes, not {type(key).__name__}")


def shard_of(key, count, *, bounds=None) -> int:
    """The shard (0 to count-1) that key belongs to among count shards.

    bounds is upper_bounds(count), computed once by callers that place many keys.
    """
    if bounds is None:
        bounds = upper_bounds(count)
    h = murmur2(_key_bytes(key))
    for shard, bound in enumerate(bounds):
        if h < bound:
            return shard
    return len(bounds)


def parse_shard(text):
    """Read "I/N" (shard I of N, I counted from 0) into (I, N)."""
    index, slash, count = str(text).strip().partition("/")
    try:
        if not slash:
            raise ValueError
        index, count = int(index), int(count)
    except ValueError:
        raise ShardError(f"shard {text!r} is not I/N: write the shard's number (from 0) and "
                         f"the number of shards, e.g. 0/3 for the first of three") from None
    _check_count(count)
    if not 0 <= index < count:
        raise ShardError(f"shard {text!r}: the shard number must be from 0 to {count - 1}")
    return index, count


def split_clients_block(count, source="$shard_key", variable="$shard", prefix="shard"):
    """The nginx split_clients block that sets `variable` to prefix + shard_of(source)."""
    lines = [f'split_clients "{source}" {variable} {{']
    for shard, width in enumerate(part_widths(count)):
        lines.append(f"    {width // 100}.{width % 100:02d}% {prefix}{shard};")
    lines.append(f"    * {prefix}{count - 1};")
    lines.append("}")
    return "\n".join(lines) + "\n"
