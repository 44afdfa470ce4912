"""Serves the content of $VERSION_FILE as read at import (the 'dataset'), and its pid.

If the file says "broken", importing fails: a reload with bad data.
If it says "VERSION hold", the import writes $VERSION_FILE.loading.PID and
then waits until the test creates $VERSION_FILE.go: a generation held in
the middle of loading, for as long as the test needs.
A request for /held writes $VERSION_FILE.held.PID and answers only once
$VERSION_FILE.answer exists: an in-flight request that keeps a drain going.
"""

import os
import time

VERSION_FILE = os.environ["VERSION_FILE"]
with open(VERSION_FILE) as handle:
    VERSION = handle.read().strip()
if VERSION == "broken":
    raise ValueError("the dataset does not parse (raised on purpose by a test)")
if VERSION.endswith(" hold"):
    VERSION = VERSION.removesuffix(" hold")
    open(f"{VERSION_FILE}.loading.{os.getpid()}", "w").close()
    while not os.path.exists(f"{VERSION_FILE}.go"):
        time.sleep(0.02)  # the test's gate: polled, at import, in the new generation only

# A stand-in for a big dataset: BALLAST_MB of touched, resident memory.
BALLAST = bytearray(int(os.environ.get("BALLAST_MB", "0")) * 1024 * 1024)
for offset in range(0, len(BALLAST), 4096):
    BALLAST[offset] = 1


def app(environ, start_response):
    if environ["PATH_INFO"] == "/held":
        open(f"{VERSION_FILE}.held.{os.getpid()}", "w").close()
        while not os.path.exists(f"{VERSION_FILE}.answer"):
            time.sleep(0.02)  # gevent's sleep (monkey-patched): the loop keeps serving
    body = f"{VERSION} {os.getpid()}".encode()
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]
