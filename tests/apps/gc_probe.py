"""What the serving process's collector sees, for the garbage tests.

  /handlers   how many HTTP connections are alive (found by gc): the most
              of any one of a connection's objects (its handler, transport,
              reader, responder, its finished greenlet): the one serving this
              request, plus any left uncollected
  /threshold  gc.get_threshold() of the serving process, space-separated
  /promote    leave a cycle behind that first survived a collection of the
              young generations: garbage in the oldest generation
  /churn      leave 2,000 short cycles behind (what triggers collections)
  /leftovers  how many cycles /promote left are still alive
"""

import collections
import gc

import gevent

#: the classes of which each connection makes one
PER_CONNECTION = {"Handler", "Transport", "Reader", "Responder"}


class Leftover:
    alive = 0

    def __init__(self):
        Leftover.alive += 1
        self.me = self  # a cycle: only the collector frees it

    def __del__(self):
        Leftover.alive -= 1


def app(environ, start_response):
    if environ["PATH_INFO"] == "/promote":
        held = Leftover()
        gc.collect(1)  # it survives generations 0 and 1: promoted to the oldest
        del held
        body = "promoted"
    elif environ["PATH_INFO"] == "/churn":
        for _ in range(2000):
            cycle = []
            cycle.append(cycle)
        body = "churned"
    elif environ["PATH_INFO"] == "/leftovers":
        body = str(Leftover.alive)
    elif environ["PATH_INFO"] == "/handlers":
        alive = collections.Counter(
            type(obj).__name__ for obj in gc.get_objects()
            if type(obj).__module__.startswith("forkserve.http.") and
            type(obj).__name__ in PER_CONNECTION or
            isinstance(obj, gevent.Greenlet) and obj.dead)
        body = str(max(alive.values(), default=0))
    elif environ["PATH_INFO"] == "/threshold":
        body = " ".join(str(n) for n in gc.get_threshold())
    else:
        body = "ok"
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [body.encode()]
