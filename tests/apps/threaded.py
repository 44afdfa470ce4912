"""An application that leaves a thread running in the master, so that the
master forks its workers with it alive. THREAD=python starts a threading
module thread named "poller" (run with --no-monkey-patch: a real thread);
THREAD=c arms faulthandler's watchdog, a C thread the threading module never
sees. tests/test_threads_e2e.py reads what the master logs about it."""

import faulthandler
import os
import threading
from wsgiref.validate import validator

if os.environ["THREAD"] == "python":
    threading.Thread(target=threading.Event().wait, name="poller", daemon=True).start()
else:
    faulthandler.dump_traceback_later(3600)


def _app(environ, start_response):
    body = str(os.getpid()).encode()
    start_response("200 OK", [("Content-Type", "text/plain"),
                              ("Content-Length", str(len(body)))])
    return [body]


app = validator(_app)
