"""An application whose import is pure CPU work for LOAD_SECONDS (default 2):
it never yields, like a real dataset load."""

import os
import time

_deadline = time.monotonic() + float(os.environ.get("LOAD_SECONDS", "2"))
_data = []
while time.monotonic() < _deadline:
    _data.append(sum(range(1000)))


def app(environ, start_response):
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [str(len(_data)).encode()]
