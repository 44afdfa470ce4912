"""share()'s walk in pure Python: for when forkserve.memory._immortal did not build.

`walk(root, backend, value)` visits everything reachable from `root` that a
dataset is made of (str, bytes, numbers, dict, list, tuple, set, and
instances of plain classes), once each, and with a `backend` marks each
object immortal by writing its reference count (`ctypes_backend()` reads and
writes counts with ctypes on CPython 3.12-3.13). It returns (objects, bytes).
forkserve.memory.sharing decides when it runs and reports what it did.
"""

import functools
import gc
import struct
import sys
import types

__all__ = ["ctypes_backend", "walk"]

@functools.cache
def ctypes_backend():
    """Reads and writes reference counts with ctypes; None when it cannot."""
    if hasattr(sys, "getobjects") or not (3, 12) <= sys.version_info < (3, 14):
        return None  # Py_TRACE_REFS moves ob_refcnt; other versions: unknown layouts
    try:
        import ctypes
    except ImportError:
        return None
    return _CtypesBackend(ctypes)


class _CtypesBackend:
    """The object header as ctypes sees it (CPython 3.12/3.13, not free-threaded)."""

    def __init__(self, ctypes):
        #: The ob_refcnt word of the object at an address, readable and writable.
        self.refcount_at = ctypes.c_ssize_t.from_address
        self._byte_at = ctypes.c_uint8.from_address
        # PyASCIIObject: ob_refcnt, ob_type, length, hash, then the state
        # bit field, whose first two bits are `interned`.
        self._state_offset = 4 * ctypes.sizeof(ctypes.c_void_p)
        as_utf8 = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_void_p)
        self.fill_utf8 = as_utf8(("PyUnicode_AsUTF8AndSize", ctypes.pythonapi))

    def refcnt(self, obj):
        return self.refcount_at(id(obj)).value

    def mark(self, obj, value):
        self.refcount_at(id(obj)).value = value

    def is_immortal(self, obj):
        return self.refcnt(obj) & _IMMORTAL_BIT != 0

    def is_interned(self, text):
        return self._byte_at(id(text) + self._state_offset).value & 3 != 0


#: _Py_IsImmortal() on 64-bit 3.12/3.13: the low 32 bits of ob_refcnt, read
#: as a signed int, are negative.
_IMMORTAL_BIT = 1 << 31
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
    if flags & _HEAPTYPE and flags & _HAVE_GC and (
            cls.__dictoffset__ or flags & _MANAGED_DICT):
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


def walk(root, backend, value, fill_utf8_cache=True):
    """The C walker's job, slower: for when forkserve.memory._immortal did not build.

    With a backend and value, marks objects immortal and uses the mark as the
    visited mark; with None, None only caches hashes and remembers ids.
    """
    marking = value is not None
    if marking:
        refcount_at, is_interned = backend.refcount_at, backend.is_interned
    fill_utf8 = backend.fill_utf8 if marking and fill_utf8_cache else None
    seen = set()
    objects = size = 0
    stack = []
    pending = [root]
    if marking and backend.is_immortal(root):
        kind = _kind(root)
        if kind in _CONTAINERS or (kind and type(root).__flags__ & _HEAPTYPE):
            stack.append((root, kind))
        pending = []
    while pending or stack:
        if not pending:
            parent, kind = stack.pop()
            pending = _children(parent, kind)
        for obj in pending:
            if marking:
                refcount = refcount_at(id(obj))
                if refcount.value & _IMMORTAL_BIT:
                    continue
            kind = type(obj)
            if kind not in _KINDS:
                kind = _kind(obj)
                if kind is None:
                    continue
            if marking:
                if kind is str and is_interned(obj):
                    continue
            elif id(obj) in seen:
                continue
            else:
                seen.add(id(obj))
            if kind is str or kind is bytes or kind is frozenset:
                kind.__hash__(obj)
                if fill_utf8 is not None and kind is str and not str.isascii(obj):
                    try:
                        fill_utf8(obj, None)
                    except UnicodeEncodeError:
                        pass  # lone surrogates have no UTF-8 form to cache
            size += _size(obj, kind)
            if kind in _CONTAINERS or type(obj).__flags__ & _HEAPTYPE:
                stack.append((obj, kind))
            if marking:
                refcount.value = value
            objects += 1
        pending = []
    return objects, size
