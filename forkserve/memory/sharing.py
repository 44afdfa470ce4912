"""Keep a preloaded dataset shared between forked workers: forkserve.share(obj).

    people = load_people("people.csv")      # in the master, before forking
    print(forkserve.share(people))          # shared 2,000,001 objects (...)

Why: after fork, a worker shares the master's pages until it writes to one.
Reading a Python object writes to it: its reference count on every access,
the cached hash of a str (and from 3.14 of a tuple) the first time it is
hashed, and its GC header when a collection runs. forkserve.memory.cow stops
the collector; share() stops the rest for everything reachable from obj, so
random reads in a worker copy nothing.

What share(obj) does, in order (the C walker, forkserve/memory/_immortal.c,
says how):

1. Walks the graph from obj through what records are made of: dicts (keys
   and values), lists, tuples (named tuples too), sets, frozensets, str,
   bytes, int, float, and instances of Python classes (with a __dict__,
   __slots__, or both: dataclasses, frozen or with slots=True). It does not go
   into types, modules, functions, or objects of C types (a datetime, a
   Decimal, a deque): it counts those by type, and the report names them.
2. Caches the hash of every str, bytes and frozenset (and of tuples of
   builtins from 3.14), and the UTF-8 form of every non-ASCII str.
3. Makes each object immortal, as the interpreter reads it (a count on 3.12
   and 3.13; the count and the immortal bit of ob_flags from 3.14), except
   what the mortality rule keeps mortal: an object whose death can run code
   or release something (a finaliser, a weakref pointing at it, a generator,
   a buffer view, an OS resource), an untracked C object not known to be
   plain data (PLAIN_TYPES), and every object it is reachable from through
   data. So dropping what holds a file still closes the file. The report
   counts what stayed mortal, by type, and names the seeds that kept most.
4. gc.freeze(), so no collection examines the shared objects again.

Invariants and their reasons:

- Nothing is marked unless this interpreter is one the marking was checked
  against (CPython 3.12 to 3.15, 64-bit, not free-threaded, not a debug
  build: CHECKED_VERSIONS) and a probe (forkserve.memory.probe, once per
  process) has shown that a forked child's reads leave a marked object's
  page unwritten. Anywhere else share() only caches hashes and freezes the
  GC, and warns once per process (SharingWarning) saying why.
- Shared objects are never freed. Share only data that lives as long as the
  process. Replacing the dataset is a reload (a new master process), not an
  assignment: the old objects would stay in memory.
- Mutating a shared container after share() is allowed and safe, but what
  it replaces or removes is leaked, and what it adds is not shared until
  share() is called on the container (or on the added objects) again.
- A failed share() (MemoryError) leaves no container marked: calling it
  again finishes the job.

Still written on read, and not handled here: the interpreter's
specialization caches in code objects, type version tags, instance.__dict__
or vars(instance) (creates the dict of an instance that keeps its attributes
inline, the first time), and anything share() does not go into (above).
"""

import contextlib
import dataclasses
import functools
import gc
import os
import sys
import sysconfig
import time
import types
import warnings

from forkserve import cext
from forkserve.memory import probe
from forkserve.memory.walker import walk as _walk_python

__all__ = ["CHECKED_VERSIONS", "ShareReport", "SharingWarning", "immortal_supported", "share"]

#: The versions whose headers the marking was checked against
#: (forkserve/memory/_immortal.c says what each reads). Any other gets no
#: marking and one log line.
CHECKED_VERSIONS = ((3, 12), (3, 13), (3, 14), (3, 15))

#: Fill the UTF-8 cache of non-ASCII str before fork. PyUnicode_AsUTF8()
#: (orjson, C functions taking text as char *) stores the UTF-8 form inside
#: the str the first time, which writes the str's page in the worker. Filling
#: it in the master costs the UTF-8 size of the non-ASCII strings once, in
#: shared memory; not filling it can cost a page per string in every worker.
#: Measured on 100,000 CSV records (125 MB, a quarter of the names
#: non-ASCII), a worker running orjson.dumps over every record: 62 MB copied
#: without it, 0.9 MB with it; the master grew by 1.9 MB.
fill_utf8_cache = True

#: Set to a non-empty value to ignore the C extensions (forkserve.cext).
NO_C_ENV = cext.NO_C_ENV

#: Types that own an OS resource, or run code, when they die without a
#: finaliser the walker sees, looked up in the modules already imported
#: (nothing is imported for this). Most also have a finaliser, which the
#: walker sees by itself; mmap, epoll and SemLock do not, and a greenlet
#: throws GreenletExit into itself from its dealloc (finally blocks run).
RESOURCE_TYPES = (("mmap", "mmap"), ("select", "epoll"), ("select", "devpoll"),
                  ("select", "kqueue"), ("_multiprocessing", "SemLock"),
                  ("_sqlite3", "Connection"), ("sqlite3", "Connection"),
                  ("_socket", "socket"), ("_io", "_IOBase"), ("subprocess", "Popen"),
                  ("greenlet", "greenlet"))

#: C types the collector does not track that are plain data: what they hold
#: (numbers, a str, a timedelta) dies with them and releases nothing else.
#: Any other untracked C type stays mortal, with what holds it: the walker
#: cannot see its references (an lru_cache's links hold its results).
#: (object, bool, range and bytearray the walker knows by itself.)
PLAIN_TYPES = (("datetime", "date"), ("datetime", "timedelta"), ("datetime", "timezone"),
               ("decimal", "Decimal"), ("_decimal", "Decimal"))

#: Plain while their tzinfo is None or plain (a timezone); a ZoneInfo or a
#: Python tzinfo could be held by nothing else.
ZONED_TYPES = (("datetime", "datetime"), ("datetime", "time"))

#: A seed that kept at least this many objects mortal is named in the report
#: (a ZoneInfo held by every record of a dataset keeps the records mortal).
LARGE_MORTAL = 1000

_state = {"warned": False}


class SharingWarning(RuntimeWarning):
    """share() could only cache hashes: reads still write reference counts."""


@dataclasses.dataclass(frozen=True)
class ShareReport:
    """What share() or --share-heap did. `bytes` is roughly the sys.getsizeof()
    total of the objects made immortal; `mortal`, `seeds` and `skipped` map
    type names to how many objects stayed mortal (the mortality rule), of
    those how many die running code themselves (the rest hold one), and how
    many were not gone into (share() only: not data it knows); `leaders`
    names the seeds that kept the most objects mortal, with how many."""

    objects: int
    bytes: int
    seconds: float
    immortal: bool
    method: str  # "c" (immortal) or "hash-only"
    mortal: dict = dataclasses.field(default_factory=dict)
    seeds: dict = dataclasses.field(default_factory=dict)
    skipped: dict = dataclasses.field(default_factory=dict)
    #: ((what, objects), ...): the seeds that kept the most objects mortal
    leaders: tuple = ()

    def __str__(self):
        kept = self.kept_mortal()
        large = self.large_mortal()
        text = f"{self.headline()}; {kept}" if kept else self.headline()
        return f"{text}; {large}" if large else text

    def headline(self):
        """What was shared, and what was not: the report without the objects
        kept mortal."""
        size = f"({self.bytes / 1e6:,.1f} MB) in {self.seconds:.2f} s"
        if not self.immortal:
            return (f"cached hashes of {self.objects:,} objects {size}: "
                    "not immortal on this interpreter")
        skipped = sum(self.skipped.values())
        if skipped:
            return (f"shared {self.objects:,} objects {size}; NOT shared: {skipped:,} "
                    f"objects of kinds share() does not go into ({_by_type(self.skipped)})")
        return f"shared {self.objects:,} objects {size}"

    def kept_mortal(self):
        """The objects kept mortal for their finalisers, by type ("" if none)."""
        mortal = sum(self.mortal.values())
        if not self.immortal or not mortal:
            return ""
        text = f"kept mortal, so their finalisers still run: {mortal:,} objects"
        seeds = sum(self.seeds.values())
        if seeds:
            text += (f", {seeds:,} that run code or release something when they die, or "
                     f"hold what no walk sees ({_by_type(self.seeds, shown=16)})")
        return text + f" and what holds them ({_by_type(self.mortal)})"

    def large_mortal(self):
        """The objects that each kept a large part of the heap mortal ("" if
        none): shown with the headline, since they cost sharing."""
        large = [f"{what} {count:,}" for what, count in self.leaders if count >= LARGE_MORTAL]
        if not self.immortal or not large:
            return ""
        return (f"{sum(self.mortal.values()):,} objects kept mortal; "
                f"most of them kept by {', '.join(large)}")


def _by_type(counts, shown=4):
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    text = ", ".join(f"{name} {count:,}" for name, count in ranked[:shown])
    return text + (f" and {len(ranked) - shown} more types" if len(ranked) > shown else "")


def report_of(result, started, immortal=True):
    """A ShareReport from a walker's (objects, bytes, mortal, seeds, skipped, leaders)."""
    objects, size, mortal, seeds, skipped, leaders = result
    return ShareReport(objects, size, time.perf_counter() - started, immortal,
                       "c" if immortal else "hash-only", _named(mortal), _named(seeds),
                       _named(skipped), tuple((describe(seed), n) for seed, n in leaders))


def describe(obj):
    """A short name for a seed: its repr where its type's C code makes it,
    else what it is (no __repr__ of the application runs)."""
    cls = type(obj)
    name = f"{cls.__module__}.{cls.__qualname__}".removeprefix("builtins.")
    for kind in (dict, list, tuple, set, frozenset):
        if isinstance(obj, kind):
            return f"a {name} of {kind.__len__(obj):,} items"
    if isinstance(getattr(cls, "__repr__", None), types.FunctionType):
        return f"a {name} at {id(obj):#x}"
    text = repr(obj)
    return text if len(text) <= 100 else text[:97] + "..."


def _named(counts):
    return {f"{getattr(tp, '__module__', '?')}.{tp.__qualname__}".removeprefix("builtins."): n
            for tp, n in counts.items()}


def share(obj):
    """Keep everything reachable from obj shared between forked workers.

    Call in the master after loading and before forking. Returns a
    ShareReport. See the module docstring for what is and is not covered.
    """
    started = time.perf_counter()
    support = immortal_support()
    accelerator = _accelerator()
    with _gc_paused():
        if support.ok:
            result = accelerator.walk(obj, known_types(), fill_utf8_cache)
        elif accelerator is not None:
            result = accelerator.hash_only(obj, fill_utf8_cache)
        else:
            result = _walk_python(obj, fill_utf8_cache)
    gc.freeze()
    if not support.ok:
        _warn_once(support.reason)
    return report_of(result, started, immortal=support.ok)


def immortal_supported():
    """Whether share() makes objects immortal here (the probe's verdict)."""
    return immortal_support().ok


def accelerator():
    """The C extension forkserve.memory._immortal, or None if unbuilt or disabled."""
    return _accelerator()


def gc_paused():
    """A context manager: no collection inside it (the walks allocate)."""
    return _gc_paused()


def known_types():
    """(resources, plain, zoned): RESOURCE_TYPES, PLAIN_TYPES and ZONED_TYPES,
    as the types of the modules imported so far (the walkers' `known`)."""
    return _types(RESOURCE_TYPES), _types(PLAIN_TYPES), _types(ZONED_TYPES)


def _types(names):
    found = []
    for module_name, name in names:
        module = sys.modules.get(module_name)
        candidate = getattr(module, name, None) if module is not None else None
        if isinstance(candidate, type) and candidate not in found:
            found.append(candidate)
    return tuple(found)


# ---- choosing how ---------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Support:
    ok: bool      # objects are made immortal
    reason: str   # why not, when not ok
    fault: bool = False  # the probe failed where marking should work: worth a warning


def c_extension(name):
    """The optional C extension forkserve.memory.<name>, or None where it did
    not build or FORKSERVE_NO_C is set (then the pure-Python code runs)."""
    return cext.c_extension(f"forkserve.memory.{name}")


def _accelerator():
    return c_extension("_immortal")


def immortal_support():
    """Whether objects are made immortal here (.ok), or why not (.reason)."""
    return _support(_accelerator() is not None)


@functools.cache
def _support(accelerated):
    reason = unchecked_reason()
    if reason:
        return Support(False, reason)
    if not accelerated:
        return Support(False, "the C extension forkserve.memory._immortal is not built "
                              "(reinstall forkserve where a C compiler and the Python "
                              "headers are available)")
    from forkserve.memory import _immortal as backend
    if not backend.CHECKED:
        return Support(False, "forkserve.memory._immortal was built without the marking "
                              "for this interpreter")
    failure = probe.run(backend.mark, backend.restore, backend.probe_fork)
    if failure:
        return Support(False, f"the immortality probe failed ({failure})", fault=True)
    return Support(True, "")


def unchecked_reason():
    """Why this interpreter is not one the marking was checked against; "" if it is."""
    version = sys.version_info[:2]
    name = f"Python {version[0]}.{version[1]}"
    if sys.implementation.name != "cpython":
        return f"{sys.implementation.name} has no immortal objects"
    if version < (3, 12):
        return f"{name} has no immortal objects (3.12 added them)"
    if version not in CHECKED_VERSIONS:
        return (f"{name} is newer than the versions forkserve's marking was checked "
                f"against (3.12 to 3.15)")
    if sysconfig.get_config_var("Py_GIL_DISABLED"):
        return "free-threaded builds count references differently"
    if hasattr(sys, "gettotalrefcount"):
        return "debug builds track every reference"
    if sys.maxsize < 2**32:
        return "32-bit builds lay out the reference count differently"
    return ""


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
