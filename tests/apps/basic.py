"""A small WSGI app for end-to-end tests, checked by wsgiref.validate."""

import gc
import json
import os
import time
from wsgiref.validate import validator

from gevent import monkey

_original_sleep = monkey.get_original("time", "sleep")


def _app(environ, start_response):
    path = environ["PATH_INFO"]
    status, body = "200 OK", b""
    if path == "/pid":
        body = str(os.getpid()).encode()
    elif path == "/slow":
        seconds = float(environ.get("QUERY_STRING") or "1")
        if os.environ.get("MARK_DIR"):  # tells a test this request is in flight
            open(os.path.join(os.environ["MARK_DIR"], f"slow-{os.getpid()}"), "w").close()
        time.sleep(seconds)  # cooperative: monkey-patched
        body = b"slow done"
    elif path == "/block":
        if os.environ.get("MARK_DIR"):
            open(os.path.join(os.environ["MARK_DIR"], f"block-{os.getpid()}"), "w").close()
        _original_sleep(float(environ.get("QUERY_STRING") or "30"))  # blocks the event loop
        body = b"unblocked"
    elif path == "/gc":
        body = json.dumps({"threshold": gc.get_threshold(), "freeze_count": gc.get_freeze_count(),
                           "enabled": gc.isenabled(), "counts": gc.get_count(),
                           "pid": os.getpid(),
                           "multiprocess": environ["wsgi.multiprocess"]}).encode()
    elif path == "/whoami":
        body = json.dumps({"uid": os.getuid(), "gid": os.getgid(), "pid": os.getpid()}).encode()
    elif path == "/boom":
        raise RuntimeError("boom requested")
    else:
        status, body = "404 Not Found", b"not found"
    start_response(status, [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]


app = validator(_app)
