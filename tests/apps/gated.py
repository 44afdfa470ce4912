"""An app whose import lasts until the file named by $GATE exists.

It stands for a dataset that takes a while to load, for as long as the test
wants: the test sees what the server does while the master is still loading.
"""

import os
import sys
import time

print(f"gated: loading until {os.environ['GATE']} exists", file=sys.stderr, flush=True)
while not os.path.exists(os.environ["GATE"]):
    time.sleep(0.01)


def app(environ, start_response):
    body = b'{"status": "ok"}\n'
    start_response("200 OK", [("Content-Type", "application/json"),
                              ("Content-Length", str(len(body)))])
    return [body]
