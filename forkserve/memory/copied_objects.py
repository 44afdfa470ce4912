"""`forkserve memory --why [TARGET]`: which of the master's objects a worker copied.

How it works, and the rules it rests on:

- A page a worker *copied* is one it now maps alone: /proc/PID/pagemap bit
  56 ("page exclusively mapped", Linux >= 4.2, readable without privileges)
  on a present anonymous page (bit 61 clear). Pages the worker still shares
  with the master have a second mapping, so the bit is off.
- Reading a Python object writes its reference count, in the object's
  header; that write is what copies a page. So a copied page is blamed on
  the objects whose headers (id(obj)) sit on it, split evenly among them.
- Walking objects writes their reference counts too: a walk in the worker
  would copy the very pages it measures. The walk runs instead in an
  *auditor*, a process the master forks for the purpose. Objects created
  before the fork sit at the same addresses in the master, the auditor and
  every worker, so the auditor's addresses are the worker's. The worker's
  pagemap is read from outside; the worker is not touched.
- After gc.freeze(), gc.get_objects() lists none of the frozen objects (so,
  the whole preloaded heap; checked on 3.11-3.13). The walk starts instead
  from every module's globals and follows gc.get_referents(). Modules and
  their __dict__ are roots, never walked into from elsewhere, so an object
  belongs to the first module-level name that reaches it: the application's
  modules first (so that its dataset's containers claim their objects), then
  the rest in sys.modules order. The walk runs in C where the optional
  extension forkserve.memory._whywalk built (tp_traverse, the same
  referents), else in Python; both count the same objects.
- What it cannot see: copies of objects the master made after the fork, a
  page the master itself wrote after the fork (then the worker holds the
  original alone), and memory outside Python objects (allocator metadata,
  buffers of containers, C extensions). Those count as "on no object the
  walk reached", next to the worker's own new allocations.

The master listens for requests on an abstract Unix socket named after its
pid (Linux), accepts only its own user or root, and forks one auditor per
request, one at a time: while an auditor runs, another request is answered
at once that it must wait (each auditor is a fork of the whole master, and
its walk takes a CPU for seconds). The auditor answers with JSON and exits.
Nothing here blocks the master.
"""

import array
import collections
import errno
import gc
import json
import logging
import os
import re
import signal
import socket
import struct
import sys
import time

from forkserve.memory import sharing

__all__ = ["WhyError", "WhyListener", "ask", "listen", "attribute", "decode_pagemap", "explain", "format_why",
           "parse_maps", "socket_name"]

log = logging.getLogger("forkserve.error")

_PRESENT = 1 << 63
_FILE_OR_SHARED = 1 << 61
_EXCLUSIVE = 1 << 56
_WANTED_MASK = _PRESENT | _FILE_OR_SHARED | _EXCLUSIVE
_WANTED = _PRESENT | _EXCLUSIVE

#: Seconds an auditor may take (the walk visits every object once: about a
#: second per few million objects) before the asking command gives up.
AUDIT_TIMEOUT = 300.0

#: Owners and types listed, biggest first.
TOP = 15

_MAPS_LINE = re.compile(r"^([0-9a-f]+)-([0-9a-f]+) (\S{4}) ", re.MULTILINE)


def socket_name(master_pid):
    """The abstract Unix socket a master listens on for --why requests."""
    return f"\0forkserve-why-{master_pid}"


# -- the worker's pages (pure parts first) ------------------------------------


def parse_maps(text):
    """(start, end) of every private writable mapping in /proc/PID/maps text:
    the only mappings whose pages can be copy-on-write copies."""
    return [(int(start, 16), int(end, 16))
            for start, end, perms in _MAPS_LINE.findall(text)
            if perms[1] == "w" and perms[3] == "p"]


def decode_pagemap(data, first_page):
    """Page numbers of the present, anonymous, exclusively mapped entries in
    raw pagemap bytes whose first entry is page first_page."""
    entries = array.array("Q")
    entries.frombytes(data)
    return [first_page + index for index, entry in enumerate(entries)
            if entry & _WANTED_MASK == _WANTED]


def exclusive_pages(pid, page_size):
    """Page numbers the process maps alone (its copies and its own allocations)."""
    with open(f"/proc/{pid}/maps") as handle:
        mappings = parse_maps(handle.read())
    pages = set()
    with open(f"/proc/{pid}/pagemap", "rb", buffering=0) as pagemap:
        for start, end in mappings:
            first = start // page_size
            pagemap.seek(first * 8)
            pages.update(decode_pagemap(pagemap.read((end - start) // page_size * 8), first))
    return pages


# -- the walk (in the auditor) ------------------------------------------------


def _roots(first_modules):
    """[(qualified name, object)] of every module global, first_modules' first."""
    modules = [(name, module) for name, module in list(sys.modules.items())
               if getattr(module, "__dict__", None) is not None]

    def order(item):
        name = item[0]
        return 0 if any(name == m or name.startswith(m + ".") for m in first_modules) else 1

    roots = []
    for name, module in sorted(modules, key=order):
        roots += [(f"{name}.{key}", value) for key, value in list(vars(module).items())
                  if not (key.startswith("__") and key.endswith("__"))]
    return roots, modules


#: Seconds between progress reports while walking (the command prints them).
PROGRESS_EVERY = 1.0

#: Objects walked between looks at the clock.
_CLOCK_EVERY = 1 << 13


def walk(first_modules, pages, page_shift, progress=None, in_c=True):
    """Count object headers on the given pages, by (root index, type name).

    Returns (roots, {page: Counter((root index, type name))}, objects walked).
    progress(objects walked), if given, is called about every PROGRESS_EVERY
    seconds.

    The walk runs in C (forkserve.memory._whywalk) where that extension
    built, unless in_c is false or FORKSERVE_NO_C is set; both walks count
    the same. In Python the cost is one set lookup and insertion of id() per
    object; batching through gc.get_referents(*objects) measured no faster
    (benchmarks/results/why_walk.md), which is why the C walk exists. The
    collector is off meanwhile: the walk makes no cycles, and each
    gc.get_referents() list would otherwise count towards a collection of
    everything not frozen.
    """
    roots, modules = _roots(first_modules)
    barrier = {id(module) for _, module in modules} | {id(vars(module)) for _, module in modules}
    c_walk = _c_walk() if in_c else None
    with sharing.gc_paused():
        if c_walk is None:
            counts, walked = _walk(roots, barrier, pages, page_shift, progress)
        else:
            found, walked = c_walk([root for _, root in roots], pages, page_shift, barrier,
                                   progress, PROGRESS_EVERY)
            counts = collections.defaultdict(collections.Counter)
            for (page, index, kind), n in found.items():
                counts[page][index, kind.__name__] += n
        return roots, counts, walked


def _c_walk():
    """forkserve.memory._whywalk.walk, or None if unbuilt or disabled."""
    extension = sharing.c_extension("_whywalk")
    return None if extension is None else extension.walk


def _walk(roots, barrier, pages, page_shift, progress):
    seen = set(barrier)
    counts = collections.defaultdict(collections.Counter)
    walked = 0
    clock_at = _CLOCK_EVERY
    report_at = time.monotonic() + PROGRESS_EVERY
    for index, (_, root) in enumerate(roots):
        stack = [root]
        while stack:
            obj = stack.pop()
            address = id(obj)
            if address in seen:
                continue
            seen.add(address)
            walked += 1
            page = address >> page_shift
            if page in pages:
                counts[page][index, type(obj).__name__] += 1
            stack.extend(gc.get_referents(obj))
            if walked >= clock_at:
                clock_at += _CLOCK_EVERY
                if progress is not None and time.monotonic() >= report_at:
                    progress(walked)
                    report_at = time.monotonic() + PROGRESS_EVERY
    return counts, walked


def attribute(counts, page_size):
    """Bytes by root index and by type name: each page split evenly among the
    object headers on it. Pure."""
    by_root, by_type = collections.Counter(), collections.Counter()
    for counter in counts.values():
        share = page_size / sum(counter.values())
        for (root, type_name), n in counter.items():
            by_root[root] += share * n
            by_type[type_name] += share * n
    return by_root, by_type


def _describe(obj):
    kind = type(obj).__name__
    if isinstance(obj, (dict, list, tuple, set, frozenset)):
        return f"{kind} of {len(obj):,} entries"
    if isinstance(obj, (str, bytes, bytearray)):
        return f"{kind} of {len(obj):,} characters" if isinstance(obj, str) else (
            f"{kind} of {len(obj):,} bytes")
    return kind


def explain(pid, first_modules=(), progress=None):
    """Read the worker's exclusive pages and blame them on the objects on them.

    Run in a process forked from the worker's master (see the module
    docstring); returns the JSON-ready result format_why() renders.
    progress({"objects_walked": n, "seconds": s}), if given, is called as
    the walk goes (about every PROGRESS_EVERY seconds, and once at its start).
    """
    started = time.monotonic()

    def report(objects):
        if progress is not None:
            progress({"objects_walked": objects, "seconds": time.monotonic() - started})

    page_size = os.sysconf("SC_PAGE_SIZE")
    pages = exclusive_pages(pid, page_size)
    report(0)
    roots, counts, walked = walk(first_modules, pages, page_size.bit_length() - 1, report)
    by_root, by_type = attribute(counts, page_size)
    on_objects = len(counts) * page_size
    return {
        "pid": pid,
        "exclusive_bytes": len(pages) * page_size,
        "on_objects_bytes": on_objects,
        "owners": [{"name": roots[index][0], "what": _describe(roots[index][1]),
                    "bytes": round(size)} for index, size in by_root.most_common(TOP)],
        "types": [{"type": name, "bytes": round(size)} for name, size in by_type.most_common(TOP)],
        "objects_walked": walked,
        "seconds": time.monotonic() - started,
        "kept_mortal": _kept_mortal(),
    }


def _kept_mortal():
    """What heap sharing left mortal in the master (workers copy it as they
    read it), and the objects that kept the most of it; None if not shared."""
    from forkserve.memory import heap
    report = heap.last_report()
    if report is None:
        return None
    return {"objects": sum(report.mortal.values()),
            "by": [{"what": what, "objects": n} for what, n in report.leaders]}


def format_why(result):
    """The result of explain() as text for people."""
    from forkserve.memory.render import format_size

    exclusive, on_objects = result["exclusive_bytes"], result["on_objects_bytes"]
    lines = [
        f"Worker pid {result['pid']}: {format_size(exclusive)} of anonymous memory mapped by it "
        f"alone; {format_size(on_objects)} of it on pages holding the master's objects "
        f"(copied), {format_size(exclusive - on_objects)} on no object the walk reached (the "
        f"worker's own allocations, buffers, allocator metadata).",
        "",
        "Copied, by the module-level name that holds the objects:",
    ]
    lines += [f"  {format_size(o['bytes']):>10}  {o['name']}: {o['what']}"
              for o in result["owners"]] or ["  (nothing)"]
    lines += ["", "Copied, by type of object:"]
    lines += [f"  {format_size(t['bytes']):>10}  {t['type']}" for t in result["types"]] or [
        "  (nothing)"]
    lines += ["", f"({result['objects_walked']:,} objects walked in "
                  f"{result['seconds']:.1f} s, in a process forked from the master.)"]
    mortal = result.get("kept_mortal")
    if mortal:
        leaders = ", ".join(f"{m['what']} ({m['objects']:,})" for m in mortal["by"])
        lines.append(f"Heap sharing kept {mortal['objects']:,} of the master's objects mortal "
                     f"(their finalisers run; workers copy them as they read them); most by: "
                     f"{leaders or 'none'}.")
    if mortal is not None and exclusive - on_objects > exclusive / 2:
        lines.append("Most of it is the worker's own. With the heap shared, what a worker "
                     "stores in a dict, list, set or instance made at import is never freed, "
                     "even once the worker replaces or drops it: if this grows, pass that "
                     "container (or its module) to forkserve.keep_mortal() at import "
                     "(docs/heap-sharing.md).")
    if result["owners"] and result["owners"][0]["bytes"] > exclusive / 4:
        lines.append(f"Reading {result['owners'][0]['name']} copies it into every worker: "
                     "pass it to forkserve.share() before the fork (Python 3.12+), or keep "
                     "the data in a forkserve.store.")
    return "\n".join(lines)


# -- the channel: master side -------------------------------------------------


class WhyListener:
    """The master's end: forks an auditor per request, one at a time, never blocks.

    Create in the master, poll filenos() for reading with the loop's select
    and call service(readable); fork is the real os.fork (not gevent's).
    """

    def __init__(self, first_modules=(), fork=os.fork):
        self.first_modules = tuple(first_modules)
        self.fork = fork
        self.auditor = None  # the pid of the auditor running, if one is
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(socket_name(os.getpid()))
        self.sock.listen(8)
        self.sock.setblocking(False)
        self.sock.set_inheritable(False)

    def filenos(self):
        return [self.sock.fileno()]

    def service(self, readable):
        if self.sock.fileno() not in readable:
            return
        try:
            conn, _ = self.sock.accept()
        except (BlockingIOError, InterruptedError, ConnectionAbortedError):
            return
        with conn:
            uid = struct.unpack("3i", conn.getsockopt(
                socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))[1]
            if uid not in (0, os.getuid()):
                return  # another user: closed unanswered
            if self._auditing():
                busy = {"error": f"master {os.getpid()} is answering another --why (auditor "
                                 f"pid {self.auditor}); one runs at a time: try again once it "
                                 "is done"}
                try:
                    # read the question first: closing on it unread would reset the answer
                    conn.recv(64, socket.MSG_DONTWAIT)
                    conn.sendall(json.dumps(busy).encode() + b"\n")
                except OSError:
                    pass  # not arrived yet (the answer may then be reset), or the asker left
                return
            pid = self.fork()
            if pid == 0:
                self._audit(conn)  # never returns
            self.auditor = pid

    def _auditing(self):
        """The last auditor forked still runs (neither exited nor reaped)."""
        from forkserve.memory import procfs

        if self.auditor is None:
            return False
        stat = procfs.read_stat(self.auditor)  # None once it exited (a zombie too)
        if stat is None or stat.ppid != os.getpid():
            self.auditor = None
            return False
        return True

    def close(self):
        self.sock.close()

    def _audit(self, conn):
        status = 1
        try:
            for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT, signal.SIGHUP,
                           signal.SIGCHLD, signal.SIGUSR1, signal.SIGTTIN, signal.SIGTTOU):
                signal.signal(signum, signal.SIG_DFL)
            signal.set_wakeup_fd(-1)
            conn.setblocking(True)
            conn.settimeout(10)
            pid = int(conn.makefile("rb").readline(32))

            def progress(figures):  # one JSON line each, before the answer's line
                conn.sendall(json.dumps({"progress": figures}).encode() + b"\n")

            answer = self._answer(pid, progress)
            conn.sendall(json.dumps(answer).encode() + b"\n")
            status = 0
        except (OSError, ValueError) as exc:
            log.warning("forkserve memory --why: auditor failed: %r", exc)
        finally:
            os._exit(status)

    def _answer(self, pid, progress):
        from forkserve.memory import procfs

        stat = procfs.read_stat(pid)
        if stat is None or stat.ppid != os.getppid():
            return {"error": f"pid {pid} is not a worker of master {os.getppid()}"}
        return explain(pid, self.first_modules, progress)


class _NoListener:
    """Stands in where --why cannot be served (no abstract sockets)."""

    def filenos(self):
        return []

    def service(self, readable):
        pass

    def close(self):
        pass


def listen(app_name, fork=os.fork):
    """A WhyListener for the master of app_name ("package.module:app"): that
    module and its top package are walked first."""
    module = app_name.partition(":")[0]
    first = (module, module.partition(".")[0]) if module else ()
    try:
        return WhyListener(first, fork=fork)
    except OSError as exc:  # not Linux, or a name clash with a master of a reused pid
        log.warning("forkserve memory --why is not served by this master: %s", exc)
        return _NoListener()


# -- the channel: command side ------------------------------------------------


class WhyError(Exception):
    """The question could not be asked or answered; the message says what to do."""


def ask(worker_pid, timeout=AUDIT_TIMEOUT, progress=None):
    """Ask the master of worker_pid to explain its private memory.

    progress(figures) is called with each progress report the auditor sends
    ({"objects_walked", "seconds"}) while it walks. `timeout` bounds the
    wait for each line, so a long walk that reports progress never times out.
    """
    from forkserve.memory import procfs

    stat = procfs.read_stat(worker_pid)
    if stat is None:
        raise WhyError(f"no process {worker_pid}: give the pid of a running forkserve worker "
                       "(`forkserve memory` shows them)")
    title = procfs.parse_title(procfs.read_title(worker_pid))
    if title is None or title.role != "worker":
        raise WhyError(f"pid {worker_pid} is not a forkserve worker; --why explains a "
                       "worker's private memory (`forkserve memory` shows them)")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(socket_name(stat.ppid))
        sock.sendall(b"%d\n" % worker_pid)
        data = b""
        for line in sock.makefile("rb"):
            message = json.loads(line)
            if "progress" not in message:
                data = line
                break
            if progress is not None:
                progress(message["progress"])
    except (ConnectionRefusedError, FileNotFoundError):
        raise WhyError(f"the master (pid {stat.ppid}) of worker {worker_pid} does not answer "
                       "--why: is it a forkserve of this version, started on Linux?") from None
    except TimeoutError:
        raise WhyError(f"no answer within {timeout:g} s from master {stat.ppid}") from None
    except OSError as exc:
        if exc.errno in (errno.ECONNRESET, errno.EPIPE):
            raise WhyError(f"master {stat.ppid} closed the connection: run forkserve memory "
                           "as the user the server runs as, or as root") from None
        raise
    finally:
        sock.close()
    if not data:
        raise WhyError(f"master {stat.ppid} gave no answer: see its log, and run forkserve "
                       "memory as the user the server runs as, or as root")
    answer = json.loads(data)
    if "error" in answer:
        raise WhyError(answer["error"])
    return answer
