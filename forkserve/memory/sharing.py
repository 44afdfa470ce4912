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

Still written on read, and not handled here: the interpreter's
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
import importlib
import os
import sys
import sysconfig
import time
import warnings

from forkserve.memory.walker import ctypes_backend as _ctypes_backend
from forkserve.memory.walker import walk as _walk_python

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
            objects, size = _walk_python(obj, backend, support.value, fill_utf8_cache)
    gc.freeze()
    method = ("c" if accelerator is not None else "python") if immortal else "hash-only"
    report = ShareReport(objects, size, time.perf_counter() - started, immortal, method)
    if not immortal:
        _warn_once(support.reason)
    return report


def immortal_supported():
    """Whether share() makes objects immortal here (the probe's verdict)."""
    return immortal_support().value is not None


def immortal_support():
    """The probe's verdict: .value, the count to write, or None and .reason."""
    return _support(_accelerator() is not None)


def accelerator():
    """The C extension forkserve.memory._immortal, or None if unbuilt or disabled."""
    return _accelerator()


def gc_paused():
    """A context manager: no collection inside it (the walks allocate)."""
    return _gc_paused()


# ---- choosing how ---------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Support:
    value: object  # the immortal reference count to write, or None
    reason: str    # why not, when value is None


def c_extension(name):
    """The optional C extension forkserve.memory.<name>, or None where it did
    not build or FORKSERVE_NO_C is set (then the pure-Python code runs)."""
    if os.environ.get(NO_C_ENV):
        return None
    try:
        return importlib.import_module(f"forkserve.memory.{name}")
    except ImportError:
        return None


def _accelerator():
    return c_extension("_immortal")


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
