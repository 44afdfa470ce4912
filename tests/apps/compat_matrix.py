"""Objects made at import that own something, served with and without heap sharing.

Each case is made when the module loads (in the master), used by a request,
and dropped by another; what the user can observe of it is returned, so the
two servers' answers can be compared (tests/test_share_heap_compat_e2e.py).
Routes: /use/<case> and /drop/<case>, for every case in CASES; /plain.

Cases: a SQLAlchemy engine and its pool, a logging file handler, a named
temporary file, a subprocess.Popen with a pipe, a requests.Session, a
WeakValueDictionary cache, a suspended generator, and a context manager
entered and never left. Then what the walk cannot see into or whose death
releases something: an lru_cache holding an open buffered file (its links
are C objects the collector does not track), a memoryview of a bytearray,
an exception whose traceback's frame holds an open buffered file, a greenlet
suspended inside try/finally, a generator not started, and the referent of
a plain weakref. Last, a cache an import-time object holds, which a worker
fills and replaces: kept mortal with forkserve.keep_mortal() ("cache"), and
not ("cache_unkept": with heap sharing the old cache is never freed, as
docs/memory.md says). DATA_DIR is where their files go.
"""

import contextlib
import functools
import gc
import logging
import os
import subprocess
import sys
import tempfile
import weakref
from wsgiref.validate import validator

import greenlet
import requests
import sqlalchemy

import forkserve

DATA_DIR = os.environ["DATA_DIR"]
events = []  # what finalisers and finally blocks did, in this process


def _open_fds(path):
    """How many of this process's descriptors are open on path."""
    count = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{name}") == path
        except OSError:
            pass  # the descriptor listdir itself used, now closed
    return count


# -- the cases, made at import --------------------------------------------------------

DB_PATH = os.path.join(DATA_DIR, "compat.sqlite")
LOG_PATH = os.path.join(DATA_DIR, "compat.log")
held = {}

engine = sqlalchemy.create_engine(f"sqlite:///{DB_PATH}", poolclass=sqlalchemy.pool.QueuePool)
with engine.begin() as connection:
    connection.execute(sqlalchemy.text("CREATE TABLE IF NOT EXISTS t (n INTEGER)"))
    connection.execute(sqlalchemy.text("DELETE FROM t"))
    connection.execute(sqlalchemy.text("INSERT INTO t VALUES (1), (2), (3)"))
held["sqlalchemy"] = engine  # the pool keeps its sqlite connection open
del engine

handler = logging.FileHandler(LOG_PATH)
log = logging.getLogger("compat_matrix")
log.addHandler(handler)
log.setLevel(logging.INFO)
log.propagate = False
log.info("made at import")
held["logging"] = handler
del handler

held["tempfile"] = tempfile.NamedTemporaryFile(dir=DATA_DIR, prefix="compat-", delete=True)
held["tempfile"].write(b"temporary")
held["tempfile"].flush()
TEMP_PATH = held["tempfile"].name

held["subprocess"] = subprocess.Popen([sys.executable, "-c", "print('child')"],
                                      stdout=subprocess.PIPE)
held["subprocess"].wait()
PIPE_FD = held["subprocess"].stdout.fileno()

held["requests"] = requests.Session()
held["requests"].headers["X-Compat"] = "made at import"


class Entry:
    def __init__(self, name):
        self.name = name


_strong = [Entry(f"entry {n}") for n in range(3)]
cache = weakref.WeakValueDictionary((entry.name, entry) for entry in _strong)
held["weakvalue"] = _strong
del _strong


def _generator():
    try:
        yield "first"
        yield "second"
    finally:
        events.append("generator finally")


held["generator"] = _generator()
next(held["generator"])


@contextlib.contextmanager
def _context():
    events.append("context entered")
    try:
        yield "inside"
    finally:
        events.append("context left")


held["context"] = _context()
held["context"].__enter__()


@functools.lru_cache  # maxsize=128: its links are C objects the collector does not track
def _opened(name):
    return open(os.path.join(DATA_DIR, name), "w")  # buffered: written out when it closes


_opened("lru.txt").write("written by the lru_cache's file")
held["lru_cache"] = _opened

held["memoryview_buffer"] = bytearray(b"exported")
held["memoryview"] = memoryview(held["memoryview_buffer"])


def _fail_holding_a_file():
    handle = open(os.path.join(DATA_DIR, "traceback.txt"), "w")
    handle.write("written by the traceback's frame")
    raise RuntimeError("saved at import")


def _saved_exception():
    try:
        _fail_holding_a_file()
    except RuntimeError as exc:
        return exc


held["traceback"] = _saved_exception()


def _greenlet_body():
    try:
        greenlet.getcurrent().parent.switch("suspended")
    finally:
        events.append("greenlet finally")


held["greenlet"] = greenlet.greenlet(_greenlet_body)
held["greenlet"].switch()

held["generator_new"] = _generator()  # not started

held["weakref"] = Entry("referent")
plain_ref = weakref.ref(held["weakref"])


class Witness:
    """Made by a worker: notes when it is freed."""

    def __del__(self):
        events.append("cache entry freed")


class Holder:
    def __init__(self):
        self.cache = {}


held["cache"] = forkserve.keep_mortal(Holder())
held["cache_unkept"] = Holder()


def _file_state(name):
    path = os.path.join(DATA_DIR, name)
    fds = _open_fds(path)
    with open(path) as handle:
        return f"fds {fds}, on disk {handle.read()!r}"


# -- what a request sees --------------------------------------------------------------

def _use(case, environ):
    if case == "sqlalchemy":
        with held["sqlalchemy"].connect() as connection:
            total = connection.execute(sqlalchemy.text("SELECT sum(n) FROM t")).scalar()
        return f"sum {total}, db fds {_open_fds(DB_PATH)}"
    if case == "logging":
        logging.getLogger("compat_matrix").info("from a request")
        held["logging"].flush()
        with open(LOG_PATH) as handle:
            return f"log fds {_open_fds(LOG_PATH)}, lines ok {'from a request' in handle.read()}"
    if case == "tempfile":
        held["tempfile"].seek(0)
        return f"{held['tempfile'].read().decode()}, exists {os.path.exists(TEMP_PATH)}"
    if case == "subprocess":
        popen = held["subprocess"]
        return f"returncode {popen.returncode}, output {popen.stdout.read().decode().strip()}"
    if case == "requests":
        host = environ["SERVER_NAME"], environ["SERVER_PORT"]
        response = held["requests"].get(f"http://{host[0]}:{host[1]}/plain", timeout=10)
        return f"{response.status_code} {response.text} {response.request.headers['X-Compat']}"
    if case == "weakvalue":
        return f"cached {sorted(cache)}"
    if case == "generator":
        return f"next {next(held['generator'])}"
    if case == "context":
        return f"events {events}"
    if case == "lru_cache":
        return f"{held['lru_cache'].cache_info().currsize} cached, {_file_state('lru.txt')}"
    if case == "memoryview":
        return f"view {bytes(held['memoryview'][:4])!r}"
    if case == "traceback":
        return f"{held['traceback']!r}, {_file_state('traceback.txt')}"
    if case == "greenlet":
        return f"dead {held['greenlet'].dead}, events {events}"
    if case == "generator_new":
        return f"next {next(held['generator_new'])}"
    if case == "weakref":
        return f"referent {plain_ref().name}"
    if case in ("cache", "cache_unkept"):
        held[case].cache.update((n, str(n)) for n in range(1000))
        held[case].cache["witness"] = Witness()
        return f"{len(held[case].cache)} cached"
    raise KeyError(case)


def _drop(case):
    """Drop the case's object; what it left behind."""
    before = list(events)
    thing = held.pop(case)
    if case == "sqlalchemy":
        dropped_alone = _open_fds(DB_PATH)  # the pool's connection: held by the engine
        thing.dispose()
        del thing
        gc.collect()
        return f"db fds {dropped_alone} then {_open_fds(DB_PATH)} after dispose()"
    if case == "logging":
        logging.getLogger("compat_matrix").removeHandler(thing)
        del thing  # logging itself keeps only weak references to handlers
        gc.collect()
        return f"log fds {_open_fds(LOG_PATH)}"
    if case == "tempfile":
        del thing
        gc.collect()
        return f"exists {os.path.exists(TEMP_PATH)}"
    if case == "subprocess":
        del thing
        gc.collect()
        try:
            os.fstat(PIPE_FD)
            return "pipe open"
        except OSError:
            return "pipe closed"
    if case == "requests":
        del thing
        gc.collect()
        return "dropped"
    if case == "weakvalue":
        del thing
        gc.collect()
        return f"cached {sorted(cache)}"
    if case == "lru_cache":
        thing.cache_clear()
        del thing
        gc.collect()
        return _file_state("lru.txt")
    if case == "memoryview":
        del thing
        gc.collect()
        try:
            held["memoryview_buffer"].extend(b" then resized")
        except BufferError as exc:
            return f"BufferError: {exc}"
        return f"resized: {bytes(held['memoryview_buffer'])!r}"
    if case == "traceback":
        del thing
        gc.collect()
        return _file_state("traceback.txt")
    if case == "weakref":
        del thing
        gc.collect()
        return f"referent {plain_ref()}"
    if case in ("cache", "cache_unkept"):
        thing.cache = {}  # the old cache, and what the worker put into it, are let go
        held[case] = thing
        gc.collect()
        return f"new events {events[len(before):]}"
    del thing  # generator, context, greenlet, generator_new
    gc.collect()
    return f"new events {events[len(before):]}"


CASES = ("sqlalchemy", "logging", "tempfile", "subprocess", "requests", "weakvalue",
         "generator", "context", "lru_cache", "memoryview", "traceback", "greenlet",
         "generator_new", "weakref", "cache", "cache_unkept")


def _app(environ, start_response):
    parts = environ["PATH_INFO"].strip("/").split("/")
    try:
        if parts == ["plain"]:
            body = "plain"
        elif parts == ["pid"]:
            body = str(os.getpid())
        elif len(parts) == 2 and parts[0] in ("use", "drop") and parts[1] in CASES:
            body = _use(parts[1], environ) if parts[0] == "use" else _drop(parts[1])
        else:
            raise KeyError(environ["PATH_INFO"])
    except KeyError:
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"not found"]
    data = body.encode()
    start_response("200 OK", [("Content-Type", "text/plain"),
                              ("Content-Length", str(len(data)))])
    return [data]


app = validator(_app)
