"""An app whose workers can be made to hold private memory on request."""

import os

_held = []


def app(environ, start_response):
    path = environ["PATH_INFO"]
    if path == "/alloc":
        megabytes = int(environ.get("QUERY_STRING") or "10")
        block = bytearray(megabytes * 1024 * 1024)
        for offset in range(0, len(block), 4096):
            block[offset] = 1  # touch every page so it is resident and private
        _held.append(block)
    body = str(os.getpid()).encode()
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]
