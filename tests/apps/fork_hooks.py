"""An application that registers at-fork hooks which sleep, and note each call.

Every hook appends "<hook> <pid>" to WITNESS_DIR/hooks and then sleeps
HOOK_SLEEP seconds (5 by default), as a hook that reconnects a client or
waits on a lock might. The heap-sharing probe must run none of them: the
master's start is then not delayed, and the only calls are the worker forks'
(tests/test_share_heap_e2e.py).
"""

import os
import time

HOOKS = os.path.join(os.environ["WITNESS_DIR"], "hooks")
SLEEP = float(os.environ.get("HOOK_SLEEP", "5"))


def _hook(name):
    def hook():
        with open(HOOKS, "a") as handle:
            handle.write(f"{name} {os.getpid()}\n")
        time.sleep(SLEEP)
    return hook


os.register_at_fork(before=_hook("before"), after_in_parent=_hook("parent"),
                    after_in_child=_hook("child"))


def app(environ, start_response):
    body = str(os.getpid()).encode()
    start_response("200 OK", [("Content-Type", "text/plain"),
                              ("Content-Length", str(len(body)))])
    return [body]
