"""--warmup PATH: the master calls the application in-process before forking.

Applications build a lot lazily, on their first requests: URL resolvers,
compiled templates, regular expressions, and, in CPython 3.12+, the
specialised form of the bytecode of every function a request runs (written
into the code objects themselves). Built in a worker, each is built once per
worker, in that worker's private memory, and specialising a shared code
object copies its page. Built in the master before the heap is shared
(--share-heap) and frozen, they are built once and shared.

Each path is requested ROUNDS times as a GET with an empty body and
Host: localhost, in the master, with no socket: a plain WSGI call. A failing
request stops the start (the log says which path and why); a status other
than 2xx/3xx is logged and the start goes on.
"""

import io
import logging
import sys
import time
import urllib.parse

from forkserve import exits

__all__ = ["ROUNDS", "run"]

log = logging.getLogger("forkserve.error")

#: Requests per path. CPython 3.12 and 3.13 specialise an instruction on its
#: second execution; a third shows the specialised form working.
ROUNDS = 3


def environ_for(path):
    """The WSGI environ of GET `path` (which may carry a ?query)."""
    target = urllib.parse.urlsplit(path)
    return {
        "REQUEST_METHOD": "GET",
        "SCRIPT_NAME": "",
        "PATH_INFO": urllib.parse.unquote(target.path, "latin-1"),
        "QUERY_STRING": target.query,
        "SERVER_NAME": "localhost",
        "SERVER_PORT": "80",
        "SERVER_PROTOCOL": "HTTP/1.1",
        "HTTP_HOST": "localhost",
        "REMOTE_ADDR": "127.0.0.1",
        "wsgi.version": (1, 0),
        "wsgi.url_scheme": "http",
        "wsgi.input": io.BytesIO(b""),
        "wsgi.errors": sys.stderr,
        "wsgi.multithread": False,
        "wsgi.multiprocess": True,
        "wsgi.run_once": False,
    }


def run(app, paths, rounds=ROUNDS):
    """Request every path `rounds` times; log what happened. Raises HaltServer."""
    started = time.perf_counter()
    statuses = {}
    for _ in range(rounds):
        for path in paths:
            status = _call(app, path)
            statuses.setdefault(status, []).append(path)
    for status, failed in sorted(statuses.items()):
        if not status.startswith(("2", "3")):
            log.warning("--warmup: %s answered %s", ", ".join(sorted(set(failed))), status)
    summary = ", ".join(f"{len(p)} x {s.split()[0]}" for s, p in sorted(statuses.items()))
    log.info("--warmup: %d requests (%s) in %.2f s", sum(map(len, statuses.values())),
             summary, time.perf_counter() - started)


def _call(app, path):
    answer = {}

    def start_response(status, headers, exc_info=None):
        answer["status"] = status
        return lambda data: None

    try:
        body = app(environ_for(path), start_response)
        try:
            for _ in body:
                pass
        finally:
            if hasattr(body, "close"):
                body.close()
    except Exception as exc:
        log.exception("--warmup: GET %s raised", path)
        raise exits.HaltServer(f"--warmup: GET {path} raised {exc!r} (traceback above); fix "
                               "the application or remove that path", exits.APP_LOAD_ERROR)
    return answer.get("status", "no status")
