"""A user's script: load data, then bottle.run() with forkserve as the server.

argv[1] is "name" (server="forkserve" after importing forkserve.bottle) or
"class" (server=ForkserveServer, for any Bottle version).
"""

import os
import sys

from gevent import monkey

monkey.patch_all()

import bottle  # noqa: E402

DATA = {f"user{i}@example.com": {"id": i, "name": f"User {i}"} for i in range(1000)}
LOADED_BY = os.getpid()

app = bottle.Bottle()


@app.get("/user/<email>")
def user(email):
    if email not in DATA:
        bottle.abort(404, "unknown")
    return dict(DATA[email], served_by=os.getpid(), loaded_by=LOADED_BY)


if sys.argv[1] == "name":
    import forkserve.bottle  # noqa: F401  (registers server="forkserve")
    server = "forkserve"
else:
    from forkserve.bottle import ForkserveServer
    server = ForkserveServer
bottle.run(app, server=server, host="127.0.0.1", port=0, workers=2, graceful_timeout=5)
print("bottle.run returned", flush=True)
