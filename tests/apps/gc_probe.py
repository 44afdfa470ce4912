"""What the serving process's collector sees, for the garbage tests.

  /handlers   how many HTTP connection handlers are alive (found by gc):
              the one serving this request, plus any left uncollected
  /threshold  gc.get_threshold() of the serving process, space-separated
"""

import gc


def app(environ, start_response):
    if environ["PATH_INFO"] == "/handlers":
        body = str(sum(1 for obj in gc.get_objects()
                       if type(obj).__module__ == "forkserve.http.handler"
                       and type(obj).__name__ == "Handler"))
    elif environ["PATH_INFO"] == "/threshold":
        body = " ".join(str(n) for n in gc.get_threshold())
    else:
        body = "ok"
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [body.encode()]
