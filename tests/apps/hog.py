"""An app whose workers can be made to hold private memory on request.

  /alloc?MB    allocate and touch MB of anonymous memory (copies count as this)
  /map?PATH    map the file at PATH read-only and read every page of it: file
               pages, resident in the page cache, not copies
  /cycle       leave cyclic garbage behind (two dicts pointing at each other)
  /gc          the gc thresholds this worker runs with
  /hold?PATH   create PATH.held, then answer once the file at PATH exists
               (keeps a request in flight)
  /seen        how many requests this process's app was called with, this
               one included
"""

import gc
import mmap
import os
import time

_held = []
_seen = 0


def app(environ, start_response):
    global _seen
    _seen += 1
    path = environ["PATH_INFO"]
    if path == "/alloc":
        megabytes = int(environ.get("QUERY_STRING") or "10")
        block = bytearray(megabytes * 1024 * 1024)
        for offset in range(0, len(block), 4096):
            block[offset] = 1  # touch every page so it is resident and private
        _held.append(block)
    elif path == "/map":
        with open(environ["QUERY_STRING"], "rb") as handle:
            mapped = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
        sum(mapped[offset] for offset in range(0, len(mapped), mmap.PAGESIZE))
        _held.append(mapped)
    elif path == "/cycle":
        left, right = {"payload": bytearray(1024)}, {}
        left["other"], right["other"] = right, left
    elif path == "/gc":
        body = " ".join(map(str, gc.get_threshold())).encode()
        start_response("200 OK", [("Content-Type", "text/plain"),
                                  ("Content-Length", str(len(body)))])
        return [body]
    elif path == "/hold":
        open(environ["QUERY_STRING"] + ".held", "w").close()
        deadline = time.monotonic() + 60
        while not os.path.exists(environ["QUERY_STRING"]) and time.monotonic() < deadline:
            time.sleep(0.05)  # cooperative under gevent: other requests go on
    body = str(_seen if path == "/seen" else os.getpid()).encode()
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]
