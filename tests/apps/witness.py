"""Witnesses for the exit discipline: atexit handlers run, finalization does not.

WITNESS_DIR gets one file per event and pid: atexit-<pid> when the app's atexit
handler runs, finalized-<pid> if interpreter finalization destroys the object
hung on `sys` (gc.freeze cannot hide that: clearing sys runs __del__).
"""

import atexit
import os
import sys

DIRECTORY = os.environ["WITNESS_DIR"]


def _mark(event):
    with open(os.path.join(DIRECTORY, f"{event}-{os.getpid()}"), "w") as handle:
        handle.write(event)


class Witness:
    def __del__(self):
        _mark("finalized")


sys.forkserve_witness = Witness()
atexit.register(_mark, "atexit")


def app(environ, start_response):
    body = str(os.getpid()).encode()
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]
