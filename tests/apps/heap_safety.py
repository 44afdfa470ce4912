"""What --share-heap means for finalisers, files and garbage, made observable.

At load (in the master) it creates an object with __del__, one held two
levels down in plain data, a weakref with a callback, a suspended generator
with a finally, a file and a socket. A finaliser, callback or finally that
runs writes a file named `<event>-<pid>` into WITNESS_DIR. Routes:

  /pid           the serving process's pid
  /drop          drop the master's finaliser objects, weakref target and generator
  /mine          create and drop a worker's own object with __del__ and a cycle
  /close         close the master's file and socket: "<pid> socket:[<inode>] True -1"
  /churn?n=N     allocate and drop N records (dicts, lists, str, cycles)
  /gc            gc.collect() in this worker: how many objects it freed
  /gcstats       "<generation 2 threshold> <full collections so far>" in this worker
  /ballast       the size of the master's ballast (makes the master's heap big)
  /witness       writes request-<pid> (for --warmup: which process was asked)
  /raise         raises RuntimeError (for --warmup: a failing warm-up request)
"""

import gc
import os
import socket
import weakref
from wsgiref.validate import validator

DIRECTORY = os.environ["WITNESS_DIR"]
BALLAST_MB = int(os.environ.get("BALLAST_MB", "0"))


def _mark(event):
    with open(os.path.join(DIRECTORY, f"{event}-{os.getpid()}"), "w") as handle:
        handle.write(event)


class Finalised:
    def __init__(self, event):
        self.event = event

    def __del__(self):
        _mark(self.event)


class Target:
    pass


def _callback(reference):
    _mark("weakref-callback")


class Wrapper:
    def __init__(self, inside):
        self.inside = inside


def _suspended():
    try:
        yield "started"
        yield "never reached"
    finally:
        _mark("generator-finally")


held = {"finalised": Finalised("master-del"), "target": Target(),
        "nested": {"inner": [Wrapper(Finalised("nested-del"))]}, "generator": _suspended()}
held["reference"] = weakref.ref(held["target"], _callback)
next(held["generator"])
master_file = open(__file__, "rb")
master_socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
ballast = [{"n": n, "text": f"record {n} " * 4} for n in range(BALLAST_MB * 2800)]


def _drop():
    for name in ("finalised", "target", "nested", "generator"):
        held.pop(name, None)
    gc.collect()
    return "dropped"


def _mine():
    mine = Finalised("worker-del")
    cycle = [mine]
    cycle.append(cycle)
    del mine, cycle
    gc.collect()
    return "made and dropped"


def _close():
    inode = os.fstat(master_socket.fileno()).st_ino
    master_file.close()
    master_socket.close()
    return f"{os.getpid()} socket:[{inode}] {master_file.closed} {master_socket.fileno()}"


def _churn(count):
    kept = 0
    for n in range(count):
        record = {"n": n, "text": f"churn {n} " * 8, "items": list(range(20))}
        record["self"] = record  # a cycle: only the worker's collector frees it
        kept += len(record)
    return f"churned {count} ({kept})"


def _app(environ, start_response):
    path = environ["PATH_INFO"]
    query = environ.get("QUERY_STRING", "")
    if path == "/pid":
        body = str(os.getpid())
    elif path == "/drop":
        body = _drop()
    elif path == "/mine":
        body = _mine()
    elif path == "/close":
        body = _close()
    elif path == "/churn":
        body = _churn(int(query.partition("n=")[2] or 1000))
    elif path == "/gc":
        body = str(gc.collect())
    elif path == "/gcstats":
        body = f"{gc.get_threshold()[2]} {gc.get_stats()[2]['collections']}"
    elif path == "/ballast":
        body = str(len(ballast))
    elif path == "/witness":
        _mark("request")
        body = "seen"
    elif path == "/raise":
        raise RuntimeError("raised on purpose by a test")
    else:
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"not found"]
    data = body.encode()
    start_response("200 OK", [("Content-Type", "text/plain"),
                              ("Content-Length", str(len(data)))])
    return [data]


app = validator(_app)
