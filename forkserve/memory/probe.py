"""The probe behind share() and --share-heap: does a marked object's page stay
unwritten when a forked child reads it?

That is the effect sharing promises, so that is what is checked, not a proxy
of it (a count read back after the reads cannot see a version whose reads
write and then undo, as 3.14's stack references do with an object whose count
alone says immortal):

1. Two subjects, a tuple and a str, are allocated alone on pages of their
   own. First at 1 MiB, kept only if each header sits exactly where glibc
   puts a block it maps by itself (16 bytes into a page, after the chunk
   header; 32 for the tuple, whose GC header comes first); otherwise at
   33 MiB, more than glibc's largest mmap threshold (32 MiB), which malloc
   always maps by itself (jemalloc and tcmalloc give such sizes extents of
   their own too), the header checked to be at the start of a page. The
   small size is tried first because freeing a block glibc mapped raises its
   mmap threshold to that block's size for the rest of the process.
   They are marked as the walks mark (`mark`), their words saved.
2. A child is forked by the C library's fork() (_immortal.probe_fork), not
   os.fork(): none of the application's os.register_at_fork hooks run, in
   the master or in the child (one that sleeps or blocks would hold up the
   start), nor gevent's. The child imports nothing and takes no lock, so
   the interpreter state Python resets after os.fork() is not needed. The
   master waits for its answer at most TIMEOUT seconds, then kills it; a
   fork that fails (OSError) or a child that does not answer fails the
   probe. The child stops its collector, then uses the subjects the
   ways the interpreter and C code take and drop references: locals,
   arguments and return values through nested calls, a global, a class
   attribute, list and dict items, iteration, len, hash, comparison. It also
   takes a reference to a small ordinary object, the control.
3. The child reads /proc/self/pagemap: the page of each subject's header must
   still be shared with the parent (not "exclusively mapped", bit 56) and the
   control's page must be exclusive (copied by the reference it took). A
   control that is not seen copied means this kernel cannot show a copy: the
   probe fails rather than pass blind.
4. The parent restores the subjects' words (they become ordinary objects
   again and are freed) and returns None, or why the probe failed.

It costs two 1 MiB (or 33 MiB) allocations for the moment it runs, and one
fork, once per process (sharing caches the verdict).
"""

import gc
import os
import struct

__all__ = ["run"]

#: Larger than glibc's DEFAULT_MMAP_THRESHOLD_MAX (32 MiB on 64-bit), the most
#: its dynamic mmap threshold can rise to: such a block is always mapped alone.
ALONE = 33 << 20
#: Tried first: mapped alone while glibc's mmap threshold is below it.
SMALL = 1 << 20
PAGE = os.sysconf("SC_PAGE_SIZE")
#: Seconds the master waits for the probe's child. It answers in well under
#: 0.1 s (it reads two 1 MiB objects and /proc); a child that takes longer is
#: stuck (a lock another thread held at the fork), and sharing is turned off.
TIMEOUT = 5.0
_PRESENT = 1 << 63
_EXCLUSIVE = 1 << 56  # "page exclusively mapped" (Linux 4.2+)


class _Held:
    """Where the child finds the subjects through an attribute."""

    subjects = ()


def run(mark, restore, fork):
    """None if marked objects stay unwritten in a forked child; else why not.

    mark(list) marks each item and returns their old words; restore(list,
    words) puts them back; fork is _immortal.probe_fork (see step 2)."""
    subjects = _subjects()
    if subjects is None:
        return "the probe could not place its objects on pages of their own"
    control = object()
    _Held.subjects = subjects
    words = mark(subjects)
    try:
        verdict = _in_child(subjects, control, fork)
    finally:
        restore(subjects, words)
        _Held.subjects = ()
    return verdict


def _subjects():
    """A tuple and a str alone on their pages, or None."""
    small = [(None,) * (SMALL // 8), " " * SMALL]
    if [id(subject) % PAGE for subject in small] == [32, 16]:  # glibc mapped each alone
        return small
    del small
    large = [(None,) * (ALONE // 8), " " * ALONE]
    return large if all(id(subject) % PAGE < 256 for subject in large) else None


def _in_child(subjects, control, fork):
    def child(fd):  # runs in the forked child, which then leaves with _exit()
        try:
            gc.disable()
            _use_all()
            keep = [control]
            answer = _check(subjects, keep[0])
        except BaseException as exc:  # the child must always answer
            answer = f"the probe's child failed: {exc!r}"[:500]
        os.write(fd, answer.encode())

    try:
        answer, timed_out = fork(child, TIMEOUT)
    except OSError as exc:
        return f"the probe could not fork a child: {exc.strerror or exc}"
    if timed_out:
        return f"the probe's child did not answer within {TIMEOUT:g} s"
    answer = answer.decode(errors="replace")
    return None if answer == "ok" else answer or "the probe's child said nothing"


def _use_all():
    for index in range(len(_Held.subjects)):
        subject = _Held.subjects[index]
        hash(subject)  # once each: hashing 4 million items takes a while
        if not subject == subject:
            raise AssertionError("the subject changed")
        _use(subject, 8)


def _use(subject, depth):
    """Take and drop references the ways the interpreter and C code do."""
    local = subject
    table = {"key": local}
    items = [local, table["key"]]
    for item in items:
        if item is not subject:
            raise AssertionError("the subject changed")
    len(local)
    local[0]
    items.clear()
    if depth:
        return _use(_pass(local), depth - 1)
    return local


def _pass(value):
    return value


def _check(subjects, control):
    """"ok", or what the pages say went wrong (runs in the child)."""
    with open("/proc/self/pagemap", "rb") as pagemap:
        def entry(address):
            pagemap.seek(address // PAGE * 8)
            return struct.unpack("<Q", pagemap.read(8))[0]

        control_entry = entry(id(control))
        if not control_entry & _PRESENT or not control_entry & _EXCLUSIVE:
            return ("the probe cannot see copied pages here (/proc/self/pagemap shows "
                    "no exclusive page after a write)")
        for subject in subjects:
            if entry(id(subject)) & _EXCLUSIVE:
                return (f"a marked {type(subject).__name__}'s page was copied when a "
                        "forked child read it")
    return "ok"
