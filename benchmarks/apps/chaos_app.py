"""The app benchmarks/chaos.py attacks: a preloaded dataset and a leak on request.

  /pid      the worker's pid (what the load asks)
  /alloc?MB allocate MB of memory, touch it and keep it: a leak; answers
            "PID TOTAL" with the MiB this worker has leaked so far

The dataset ($CHAOS_ROWS records, 200,000 by default) is built at import,
in the master, before the fork, as a preloaded application's would be.
"""

import os

ROWS = int(os.environ.get("CHAOS_ROWS", "200000"))
DATASET = {f"person-{i}": {"id": i, "name": f"Person {i}", "score": i % 97}
           for i in range(ROWS)}

_leaked = []


def app(environ, start_response):
    if environ["PATH_INFO"] == "/alloc":
        megabytes = int(environ.get("QUERY_STRING") or "5")
        block = bytearray(megabytes * 2**20)
        for offset in range(0, len(block), 4096):
            block[offset] = 1
        _leaked.append(block)
        body = f"{os.getpid()} {sum(len(b) for b in _leaked) // 2**20}".encode()
    else:
        body = str(os.getpid()).encode()
    start_response("200 OK", [("Content-Type", "text/plain"),
                              ("Content-Length", str(len(body)))])
    return [body]


application = app
