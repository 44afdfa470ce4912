"""share()'s walk in pure Python, for when forkserve.memory._immortal did not build.

`walk(root)` visits everything reachable from `root` that a dataset is made
of (str, bytes, numbers, dict, list, tuple, set, and instances of Python
classes), once each, caches the hashes of str, bytes and frozenset, and
returns (objects, bytes, {}, {}, {}, []) as the C walker's hash_only() does. It
marks nothing: making objects immortal needs the C walker, which applies
the mortality rule and writes what each interpreter version reads.
forkserve.memory.sharing decides when it runs and reports what it did.
"""

import gc
import struct
import sys
import types

__all__ = ["walk"]

_KINDS = frozenset((str, dict, list, tuple, int, float, bytes, set, frozenset))
_CONTAINERS = frozenset((dict, list, tuple, set, frozenset, object))
_HEAPTYPE = 1 << 9         # Py_TPFLAGS_HEAPTYPE
_MANAGED_DICT = 1 << 4     # Py_TPFLAGS_MANAGED_DICT
_MANAGED_WEAKREF = 1 << 3  # Py_TPFLAGS_MANAGED_WEAKREF
_HAVE_GC = 1 << 14         # Py_TPFLAGS_HAVE_GC: the type has tp_traverse
_GC_HEADER = _PREHEADER = 2 * struct.calcsize("P")  # what sys.getsizeof adds


def _kind(obj):
    """The builtin kind obj is handled as, object for an instance, or None."""
    cls = type(obj)
    if cls in _KINDS:
        return cls
    if isinstance(obj, (type, types.ModuleType)):
        return None
    for kind in (str, dict, list, tuple, int, float, bytes, set, frozenset):
        if isinstance(obj, kind):
            return kind
    flags = cls.__flags__
    if flags & _HEAPTYPE and flags & _HAVE_GC:  # a Python class: __dict__, __slots__
        return object
    return None


def _children(obj, kind):
    """What obj holds, read with the builtin methods (no user code runs)."""
    if kind is dict:
        for key, value in dict.items(obj):
            yield key
            yield value
    elif kind is list or kind is tuple:
        yield from kind.__iter__(obj)
    flags = type(obj).__flags__
    if kind is set or kind is frozenset or (flags & _HEAPTYPE and flags & _HAVE_GC):
        yield from gc.get_referents(obj)  # tp_traverse: set items, __dict__, slots


def _size(obj, kind):
    """sys.getsizeof(obj), without calling a subclass's __sizeof__."""
    cls = type(obj)
    if cls is kind:
        return sys.getsizeof(obj)
    flags = cls.__flags__
    header = _GC_HEADER if flags & _HAVE_GC else 0
    if flags & (_MANAGED_DICT | _MANAGED_WEAKREF):
        header += _PREHEADER
    return kind.__sizeof__(obj) + header


def walk(root, fill_utf8_cache=True):
    """Cache the hashes of the dataset reachable from root: (objects, bytes, {}, {}, {}, []).

    fill_utf8_cache is accepted for the C walker's signature; without the
    extension there is no way to fill the cache, so it is not filled."""
    seen = set()
    objects = size = 0
    pending = [root]
    stack = []
    while pending or stack:
        if not pending:
            parent, kind = stack.pop()
            pending = _children(parent, kind)
        for obj in pending:
            kind = type(obj)
            if kind not in _KINDS:
                kind = _kind(obj)
                if kind is None:
                    continue
            if id(obj) in seen:
                continue
            seen.add(id(obj))
            if kind is str or kind is bytes or kind is frozenset:
                kind.__hash__(obj)
            size += _size(obj, kind)
            if kind in _CONTAINERS or type(obj).__flags__ & _HEAPTYPE:
                stack.append((obj, kind))
            objects += 1
        pending = []
    return objects, size, {}, {}, {}, []
