"""An application whose at-fork hook blocks (60 s by default) in any fork made
before its heap is shared: the heap-sharing probe's fork, had it run the
application's hooks (tests/test_share_heap_e2e.py).

The worker forks run the hook too, as every os.fork() does (Gunicorn's
workers run them as well); they come after sharing, so the hook returns at
once for them. It tells the two apart by SHARED_LATER, a list made here:
sharing makes it immortal (its reference count jumps to 2**32 - 1 on 3.12
and 3.13, and is at least 2**31 from 3.14), and nothing else does. Each
call appends "before <pid> shared|unshared" to WITNESS_DIR/hooks.
"""

import os
import sys
import time

HOOKS = os.path.join(os.environ["WITNESS_DIR"], "hooks")
BLOCK = float(os.environ.get("HOOK_BLOCK", "60"))
SHARED_LATER = [os.getpid()]  # a fresh list: mortal until the heap is shared


def _before():
    shared = sys.getrefcount(SHARED_LATER) >= 1 << 30
    with open(HOOKS, "a") as handle:
        handle.write(f"before {os.getpid()} {'shared' if shared else 'unshared'}\n")
    if not shared:
        time.sleep(BLOCK)


os.register_at_fork(before=_before)


def app(environ, start_response):
    body = str(os.getpid()).encode()
    start_response("200 OK", [("Content-Type", "text/plain"),
                              ("Content-Length", str(len(body)))])
    return [body]
