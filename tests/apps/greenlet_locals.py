"""An app that keeps each request in threading.local, as Bottle does.

GET /N/PATH: the request stores PATH in a threading.local and in a
subclass's instance, then waits until N requests hold theirs at once (so
every one of them set its value before any reads it back), then answers
"<type of threading.local> <PATH read back> <the subclass's PATH>".
The local also keeps the request's environ, as Bottle's does, and its
greenlet, as an app that may kill or time it out does: the local's
attributes then lead back to the connection's greenlet.

GET /greenlets: how many gevent Greenlets are alive in this worker after
a collection (one that only the collector frees is not counted).
"""

import gc
import threading

import gevent
import gevent.event

context = threading.local()


class Request(threading.local):
    def __init__(self, path="unset"):
        self.path = path


request = Request()
waiting = []


def app(environ, start_response):
    if environ["PATH_INFO"] == "/greenlets":
        gc.collect()
        alive = sum(isinstance(o, gevent.Greenlet) for o in gc.get_objects())
        return answer(start_response, str(alive).encode())
    _, count, path = environ["PATH_INFO"].split("/", 2)
    context.path = path
    context.environ = environ
    context.greenlet = gevent.getcurrent()
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
    return answer(start_response, body)


def answer(start_response, body):
    start_response("200 OK", [("Content-Type", "text/plain"),
                              ("Content-Length", str(len(body)))])
    return [body]
