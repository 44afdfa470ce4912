"""What the serving process's collector sees, for the garbage tests.

  /handlers   how many HTTP connection handlers are alive (found by gc):
              the one serving this request, plus any left uncollected
  /threshold  gc.get_threshold() of the serving process, space-separated
  /promote    leave a cycle behind that first survived a collection of the
              young generations: garbage in the oldest generation
  /churn      leave 2,000 short cycles behind (what triggers collections)
  /leftovers  how many cycles /promote left are still alive
"""

import gc


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
        body = str(sum(1 for obj in gc.get_objects()
                       if type(obj).__module__ == "forkserve.http.handler"
                       and type(obj).__name__ == "Handler"))
    elif environ["PATH_INFO"] == "/threshold":
        body = " ".join(str(n) for n in gc.get_threshold())
    else:
        body = "ok"
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [body.encode()]
