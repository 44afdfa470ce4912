"""Keep a preloaded dataset shared between forked workers: forkserve.share(obj).

    people = load_people("people.csv")      # in the master, before forking
    print(forkserve.share(people))          # shared 2,000,001 objects (...)

Why: after fork, a worker shares the master's pages until it writes to one.
Reading a Python object writes to it: its reference count on every access,
the cached hash of a str the first time it is hashed, and its GC header when
a collection runs. forkserve.memory.cow stops the collector; share() stops the rest
for everything reachable from obj, so random reads in a worker copy nothing.

What share(obj) does, in order:

1. Walks the graph from obj through dicts (keys and values), lists, tuples,
   sets, frozensets, str, bytes, int, float, and instances of Python classes
   with a __dict__ (their attributes and slots). It does not go into types,
   modules, functions, or other objects without a __dict__ (a datetime, a
   Decimal): those, and their pages, are still written on read.
2. Caches the hash of every str, bytes and frozenset, and the UTF-8 form of
   every non-ASCII str (see fill_utf8_cache).
3. On Python 3.12 and 3.13 (not free-threaded), writes the interpreter's
   immortal reference count into each object, taken from Py_REFCNT(None).
   The interpreter then never changes that count, and never frees the
   object. The immortal mark is also the walk's visited mark: objects that
   are already immortal (None, small ints, interned strings, anything an
   earlier share() marked) are skipped and not looked inside, except obj
   itself, which is always looked inside. Interned strings are left to the
   interpreter: 3.12 makes them immortal itself, and 3.13 keeps the ones
   from sys.intern() mortal and settles their counts at exit.
4. gc.freeze(), so no collection examines the shared objects again.

Invariants and their reasons:

- Nothing is marked before a probe (once per process) has shown that this
  interpreter leaves the mark alone: a fresh object is marked, referenced
  and dereferenced, and its count must not move. On 3.11, free-threaded or
  debug builds, or when the probe fails, share() only caches hashes and
  freezes the GC, and warns once per process (SharingWarning).
- Shared objects are never freed. Share only data that lives as long as the
  process. Replacing the dataset is a reload (a new master process), not an
  assignment: the old objects would stay in memory.
- Mutating a shared container after share() is allowed and safe, but what
  it replaces or removes is leaked, and what it adds is not shared until
  share() is called on the container (or on the added objects) again.
- A failed share() (MemoryError) leaves no container marked without having
  been looked inside, so calling it again finishes the job. That holds for
  the C walker; the Python walker, used only when the extension did not
  build, may leave marked containers behind whose contents stay unshared.

Still written on read, and not handled here: pymalloc's free lists (a
worker's new objects fill holes in the master's pages), the interpreter's
specialization caches in code objects, type version tags, instance.__dict__
or vars(instance) (creates the dict of an instance that keeps its attributes
inline, the first time), and anything share() does not go into (above).
Tuple hashes are not cached by the interpreter at all before 3.14: hashing a
tuple reads it, and writes nothing.
"""

import contextlib
import dataclasses
import functools
import gc
import os
import struct
import sys
import sysconfig
import time
import types
import warnings

__all__ = ["ShareReport", "SharingWarning", "immortal_supported", "share"]

#: Fill the UTF-8 cache of non-ASCII str before fork. PyUnicode_AsUTF8()
#: (orjson, C functions taking text as char *) stores the UTF-8 form inside
#: the str the first time, which writes the str's page in the worker. Filling
#: it in the master costs the UTF-8 size of the non-ASCII strings once, in
#: shared memory; not filling it can cost a page per string in every worker.
#: Measured on 100,000 CSV records (125 MB, a quarter of the names
#: non-ASCII), a worker running orjson.dumps over every record: 62 MB copied
#: without it, 0.9 MB with it; the master grew by 1.9 MB.
fill_utf8_cache = True

#: Set to a non-empty value to ignore the C extension (tests, debugging).
NO_C_ENV = "FORKSERVE_NO_C"

_state = {"warned": False}


class SharingWarning(RuntimeWarning):
    """share() could only cache hashes: reads still write reference counts."""


@dataclasses.dataclass(frozen=True)
class ShareReport:
    """What share() did. `bytes` is roughly the sys.getsizeof() total."""

    objects: int
    bytes: int
    seconds: float
    immortal: bool
    method: str  # "c" or "python" (immortal), or "hash-only"

    def __str__(self):
        what = "shared" if self.immortal else "cached hashes of"
        how = (f"immortal, {'C' if self.method == 'c' else 'Python'} walker"
               if self.immortal else "not immortal on this interpreter")
        return (f"{what} {self.objects:,} objects ({self.bytes / 1e6:,.1f} MB) "
                f"in {self.seconds:.2f} s: {how}")


def share(obj):
    """Keep everything reachable from obj shared between forked workers.

    Call in the master after loading and before forking. Returns a
    ShareReport. See the module docstring for what is and is not covered.
    """
    started = time.perf_counter()
    accelerator = _accelerator()
    support = _support(accelerator is not None)
    immortal = support.value is not None
    with _gc_paused():
        if accelerator is not None:
            objects, size = accelerator.walk(obj, support.value, fill_utf8_cache)
        else:
            backend = _ctypes_backend() if immortal else None
            objects, size = _walk_python(obj, backend, support.value)
    gc.freeze()
    method = ("c" if accelerator is not None else "python") if immortal else "hash-only"
    report = ShareReport(objects, size, time.perf_counter() - started, immortal, method)
    if not immortal:
        _warn_once(support.reason)
    return report


def immortal_supported():
    """Whether share() makes objects immortal here (the probe's verdict)."""
    return _support(_accelerator() is not None).value is not None


# ---- choosing how ---------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Support:
    value: object  # the immortal reference count to write, or None
    reason: str    # why not, when value is None


def _accelerator():
    if os.environ.get(NO_C_ENV):
        return None
    try:
        from forkserve.memory import _immortal
    except ImportError:
        return None
    return _immortal


@functools.cache
def _support(accelerated):
    if sys.implementation.name != "cpython":
        return _Support(None, f"{sys.implementation.name} has no immortal objects")
    if sys.version_info < (3, 12):
        return _Support(None, f"Python {sys.version_info[0]}.{sys.version_info[1]} "
                              "has no immortal objects (3.12 added them)")
    if sysconfig.get_config_var("Py_GIL_DISABLED"):
        return _Support(None, "free-threaded builds count references differently")
    if hasattr(sys, "gettotalrefcount"):
        return _Support(None, "debug builds track every reference")
    if accelerated:
        from forkserve.memory import _immortal as backend
    else:
        backend = _ctypes_backend()
        if backend is None:
            return _Support(None, "the C extension forkserve.memory._immortal is not built "
                                  "and ctypes is unavailable")
    value = backend.refcnt(None)
    if value != sys.getrefcount(None):
        return _Support(None, "reference counts cannot be read reliably here")
    failure = _probe(backend, value)
    if failure:
        return _Support(None, f"the immortality probe failed ({failure})")
    return _Support(value, "")


def _warn_once(reason):
    if _state["warned"]:
        return
    _state["warned"] = True
    warnings.warn(
        f"forkserve.share(): {reason}, so reading the shared data still writes "
        "reference counts and copies those pages into each worker; share() only "
        "cached hashes and froze the GC. To keep a large dataset shared on this "
        "interpreter, load it into forkserve.store.Store (one flat buffer, no "
        "object per record), which works on every Python version.",
        SharingWarning, stacklevel=_caller_level())


def _caller_level():
    """The warnings stacklevel of the first caller outside forkserve."""
    package = os.path.dirname(__file__)
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(package + os.sep):
        frame, level = frame.f_back, level + 1
    return level


@contextlib.contextmanager
def _gc_paused():
    """No collection during a walk: the Python walker allocates as it goes."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


# ---- the probe --------------------------------------------------------------


def _probe(backend, value):
    """Mark fresh objects with value and use them; None if the mark held."""
    subjects = [["forkserve.share probe"],
                "".join(["forkserve.share probe ", str(os.getpid())])]
    for subject in subjects:
        backend.mark(subject, value)
        if not backend.is_immortal(subject):
            return f"an object marked {value:#x} is not immortal"
        _exercise(subject)
        moved = backend.refcnt(subject)
        if moved != value:
            return f"a marked reference count moved from {value:#x} to {moved:#x}"
    if backend.is_immortal(object()):
        return "a fresh object looks immortal"
    return None


def _exercise(obj):
    """Take and drop references the ways the interpreter and C code do."""
    held = [obj] * 64
    table = {"key": obj}
    for _ in range(32):
        _pass_along(table["key"], 4)
        copy = tuple(held)
        held.extend(copy[:2])
        del held[-2:], copy
    held.clear()
    table.clear()


def _pass_along(obj, depth):
    return obj if depth == 0 else _pass_along(obj, depth - 1)


# ---- the Python walker --------------------------------------------------------


@functools.cache
def _ctypes_backend():
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


def _walk_python(root, backend, value):
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
