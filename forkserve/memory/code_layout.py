"""--share-heap: move the code objects that keep writing onto pages of their own.

CPython 3.12+ writes into a code object while it runs it: the inline caches
of its specialised instructions, and the counters of instructions whose
specialisation failed or misses (forkserve.memory.heap lists them). A warm-up
settles most of that in the master, not all: a few percent of the code a
request runs keeps writing in every worker, and each such write copies the
whole page the code object sits on. Loaded from .pyc files module by
module, those code objects are scattered over the heap, one or two per page
among strings, tuples and types the workers only read; so a worker copied
about 3.7 MiB of pages to write into 0.5 MB of code (the Django test shop).

pack_writers() finds those code objects by running the warm-up's requests
once more and comparing a checksum of every code object's bytecode before
and after; it then gives each function whose code kept writing a fresh copy
of that code (code.replace()), allocated one after the other while the
allocators' free space is held (forkserve.memory.free_space.held), so that
the copies sit together on a few pages; and it runs the warm-up's requests
once more, so that the copies, and the call sites whose caches named the old
functions' versions, specialise in the master. The workers then write into
those few pages only. Measured on the Django shop (3.12, 4 workers, 20,000
requests): the pages a worker copied because code on them was written fell
from 3.7 to 2.3 MiB (a one-off page-by-page diff against the master), and
the largest worker's private memory by about 1 MiB (docs/memory.md); the
two replays cost about 3 s of start-up.

Invariants and their reasons:

- Only functions change: f.__code__ is set to an equal code object (same
  bytecode, constants, names; `==` and hash() agree with the old one).
  Frames already running (the master's own stack, a suspended generator)
  finish on the old code. A code object defined inside another function is
  reached through its parent's constants, so the parent gets a copy too,
  with the copy in its constants.
- It runs only in the master, after the warm-up and before share_heap(), and
  only when the warm-up made requests through forkserve.process.warmup.Client
  (there is nothing to compare without them). Replaying them is the
  warm-up's own work done twice more; if a replayed request raises, the
  move stops there with a warning and the server starts as it would have.
- Automatic collection stays paused throughout: a collection while the
  copies are made would free garbage among them. The garbage of the warm-up
  and of the first replay is collected once, just before the copies.
"""

import dataclasses
import gc
import sys
import time
import types
import zlib

from forkserve.memory import free_space, sharing

__all__ = ["Packed", "pack_writers"]


@dataclasses.dataclass(frozen=True)
class Packed:
    """What pack_writers() did."""
    moved: int  # code objects copied (those that kept writing, and their parents)
    writers: int  # of them, those that kept writing
    size: int  # bytes of the copies
    functions: int  # functions given a copy
    seconds: float

    def __str__(self):
        return (f"moved {self.moved:,} code objects ({self.writers:,} kept writing after the "
                f"warm-up, {self.size / 1e6:.2f} MB) onto pages of their own, for "
                f"{self.functions:,} functions, in {self.seconds:.2f} s")


def pack_writers(replay):
    """Replay the warm-up (`replay()`, which may raise), copy the code that kept
    writing into fresh, adjacent memory, replay again: a Packed."""
    started = time.perf_counter()
    with sharing.gc_paused():
        functions = [obj for obj in gc.get_objects() if type(obj) is types.FunctionType]
        codes, parents = _code_tree(functions)
        before = [_digest(code) for code in codes]  # not the bytes: they would leave holes
        replay()
        writers = [code for code, digest in zip(codes, before) if _digest(code) != digest]
        del before
        moving = _with_parents(writers, parents)
        gc.collect()  # the first warm-up's and the replay's garbage: holes for what follows
        copies = {}
        with free_space.held():  # the copies go to fresh pages, one after the other
            for code in moving.values():
                _copy(code, moving, copies)
        given = 0
        for function in functions:
            copy = copies.get(id(function.__code__))
            if copy is not None:
                function.__code__ = copy
                given += 1
        size = sum(sys.getsizeof(copy) for copy in copies.values())
        del functions, codes, parents, moving
        replay()  # the copies, and the calls that now miss, specialise here
    return Packed(len(copies), len(writers), size, given, time.perf_counter() - started)


def _digest(code):
    """A checksum of the code's bytecode as the interpreter runs it (with its
    specialised instructions, inline caches and counters)."""
    return zlib.crc32(code._co_code_adaptive)


def _code_tree(functions):
    """Every code object the functions run, nested ones included, and for each
    nested one (by id) the code objects whose constants hold it."""
    codes, parents, stack = {}, {}, [function.__code__ for function in functions]
    while stack:
        code = stack.pop()
        if id(code) in codes:
            continue
        codes[id(code)] = code
        for constant in code.co_consts:
            if type(constant) is types.CodeType:
                parents.setdefault(id(constant), []).append(code)
                stack.append(constant)
    return list(codes.values()), parents


def _with_parents(writers, parents):
    """The writers and every code object whose constants lead to one, by id."""
    moving, stack = {}, list(writers)
    while stack:
        code = stack.pop()
        if id(code) not in moving:
            moving[id(code)] = code
            stack.extend(parents.get(id(code), ()))
    return moving


def _copy(code, moving, copies):
    """The copy of `code`, its moving constants copied first (by id in `copies`)."""
    copy = copies.get(id(code))
    if copy is None:
        constants = code.co_consts
        if any(id(constant) in moving for constant in constants):
            constants = tuple(_copy(constant, moving, copies) if id(constant) in moving
                              else constant for constant in constants)
        copy = copies[id(code)] = code.replace(co_consts=constants)
    return copy
