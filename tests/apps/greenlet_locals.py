"""An app that keeps each request in threading.local, as Bottle does.

GET /N/PATH: the request stores PATH in a threading.local and in a
subclass's instance, then waits until N requests hold theirs at once (so
every one of them set its value before any reads it back), then answers
"<type of threading.local> <PATH read back> <the subclass's PATH>".
"""

import threading

import gevent.event

context = threading.local()


class Request(threading.local):
    def __init__(self, path="unset"):
        self.path = path


request = Request()
waiting = []


def app(environ, start_response):
    _, count, path = environ["PATH_INFO"].split("/", 2)
    context.path = path
    request.path = path.upper()
    arrived = gevent.event.Event()
    waiting.append(arrived)
    if len(waiting) >= int(count):
        for event in waiting:
            event.set()
        waiting.clear()
    arrived.wait(10)
    kind = type(context)
    body = f"{kind.__module__}.{kind.__qualname__} {context.path} {request.path}".encode()
    start_response("200 OK", [("Content-Type", "text/plain"),
                              ("Content-Length", str(len(body)))])
    return [body]
