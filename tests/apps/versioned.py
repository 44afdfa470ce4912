"""Serves the content of $VERSION_FILE as read at import (the 'dataset'), and its pid.

If the file says "broken", importing fails: a reload with bad data.
"""

import os

with open(os.environ["VERSION_FILE"]) as handle:
    VERSION = handle.read().strip()
if VERSION == "broken":
    raise ValueError("the dataset does not parse (raised on purpose by a test)")


def app(environ, start_response):
    body = f"{VERSION} {os.getpid()}".encode()
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]
