"""GET /: the modules this process imported after the master shared its
heap, one per line (late_imports.conf.py's post_freeze hook notes the
modules there were then)."""

import sys

#: sys.modules' names when the heap was shared (post_freeze), or None.
SHARED = None


def app(environ, start_response):
    late = sorted(set(sys.modules) - SHARED) if SHARED is not None else ["<no post_freeze>"]
    body = "\n".join(late).encode()
    start_response("200 OK", [("Content-Type", "text/plain"),
                              ("Content-Length", str(len(body)))])
    return [body]
