"""Warm-up: the master calls the application in-process before forking.

Applications build a lot lazily, on their first requests: URL resolvers,
compiled templates, regular expressions, and, in CPython 3.12+, the
specialised form of the bytecode of every function a request runs (written
into the code objects themselves). Built in a worker, each is built once per
worker, in that worker's private memory, and specialising a shared code
object copies its page. Built in the master before the heap is shared
(forkserve.memory.heap) and frozen, they are built once and shared.

Two ways to ask for it, both run by forkserve.process.boot before the heap
is shared:

- --warmup PATH: each path is requested ROUNDS times as a GET with
  Host: localhost, through one Client (so cookies an answer sets are sent
  with the next requests). A failing request stops the start (the log says
  which path and why); a status other than 2xx/3xx is logged and the start
  goes on.
- the pre_freeze(server, app) hook in the config file: any Python, usually a
  Client(app) that logs in (a POST with a form) and then fetches the pages
  behind the login. Pages only a logged-in user sees are otherwise first run
  in the workers.

forkserve never replays a warm-up: a request the pre_freeze hook makes runs
once (a POST that logs in or places an order is not safe to make twice).

Client is a plain WSGI caller, no socket: it keeps the cookies answers set
(name -> value, for every path; expiry, Path and Domain are ignored: a
warm-up is one short session) and sends them back. What a warm-up writes
(a session row, a last-login time) is written by the master, once, before
any worker exists.
"""

import io
import logging
import sys
import time
import urllib.parse

from forkserve import exits

__all__ = ["ROUNDS", "Client", "Answer", "run"]

log = logging.getLogger("forkserve.error")

#: Requests per path. CPython 3.12 and 3.13 specialise an instruction on its
#: second execution; a third shows the specialised form working.
ROUNDS = 3


def environ_for(path, method="GET", body=b"", headers=()):
    """The WSGI environ of `method path` (which may carry a ?query) with
    `body` and extra `headers` ((name, value) pairs)."""
    target = urllib.parse.urlsplit(path)
    environ = {
        "REQUEST_METHOD": method,
        "SCRIPT_NAME": "",
        "PATH_INFO": urllib.parse.unquote(target.path, "latin-1"),
        "QUERY_STRING": target.query,
        "SERVER_NAME": "localhost",
        "SERVER_PORT": "80",
        "SERVER_PROTOCOL": "HTTP/1.1",
        "HTTP_HOST": "localhost",
        "REMOTE_ADDR": "127.0.0.1",
        "wsgi.version": (1, 0),
        "wsgi.url_scheme": "http",
        "wsgi.input": io.BytesIO(body),
        "wsgi.errors": sys.stderr,
        "wsgi.multithread": False,
        "wsgi.multiprocess": True,
        "wsgi.run_once": False,
    }
    if body:
        environ["CONTENT_LENGTH"] = str(len(body))
    for name, value in headers:
        key = name.upper().replace("-", "_")
        environ[key if key in ("CONTENT_TYPE", "CONTENT_LENGTH") else "HTTP_" + key] = value
    return environ


class Answer:
    """What the application answered: `status` ("302 Found"), `code` (302),
    `headers` ([(name, value)]) and `body` (bytes)."""

    def __init__(self, status, headers, body):
        self.status = status
        self.code = int(status.split()[0]) if status[:3].isdigit() else 0
        self.headers = headers
        self.body = body

    def header(self, name):
        """The first value of header `name`, or None."""
        name = name.lower()
        return next((value for key, value in self.headers if key.lower() == name), None)


class Client:
    """Calls a WSGI application in-process, as a browser would, keeping cookies.

        client = Client(app)
        page = client.get("/admin/login/")
        client.post("/admin/login/", {"username": "warmup", "password": "...",
                                      "csrfmiddlewaretoken": client.cookies["csrftoken"]})
        client.get("/admin/")                  # now with the session cookie

    An exception the application raises propagates; statuses are not checked.
    """

    def __init__(self, app):
        self.app = app
        self.cookies = {}

    def get(self, path, headers=()):
        return self.request("GET", path, headers=headers)

    def post(self, path, form, headers=()):
        """POST `form` ({name: value}) as application/x-www-form-urlencoded."""
        body = urllib.parse.urlencode(form).encode()
        return self.request("POST", path, body, [
            ("Content-Type", "application/x-www-form-urlencoded"), *headers])

    def request(self, method, path, body=b"", headers=()):
        if not path.startswith("/"):
            raise ValueError(f"warm-up path {path!r} must start with '/' (a path on this "
                             "server, e.g. /admin/), not a URL")
        if self.cookies:
            headers = [*headers, ("Cookie", "; ".join(f"{name}={value}" for name, value
                                                      in self.cookies.items()))]
        answer = {}

        def start_response(status, response_headers, exc_info=None):
            answer["status"], answer["headers"] = status, response_headers
            return chunks.append

        chunks = []
        result = self.app(environ_for(path, method, body, headers), start_response)
        try:
            chunks.extend(result)
        finally:
            if hasattr(result, "close"):
                result.close()
        reply = Answer(answer.get("status", "no status"), answer.get("headers", []),
                       b"".join(chunks))
        self._remember(reply.headers)
        return reply

    def _remember(self, headers):
        for name, value in headers:
            if name.lower() == "set-cookie":
                pair = value.split(";", 1)[0]
                key, _, cookie = pair.partition("=")
                self.cookies[key.strip()] = cookie.strip()


def run(app, paths, rounds=ROUNDS):
    """Request every path `rounds` times; log what happened. Raises HaltServer."""
    started = time.perf_counter()
    client = Client(app)
    statuses = {}
    for _ in range(rounds):
        for path in paths:
            status = _call(client, path)
            statuses.setdefault(status, []).append(path)
    for status, failed in sorted(statuses.items()):
        if not status.startswith(("2", "3")):
            log.warning("--warmup: %s answered %s", ", ".join(sorted(set(failed))), status)
    summary = ", ".join(f"{len(p)} x {s.split()[0]}" for s, p in sorted(statuses.items()))
    log.info("--warmup: %d requests (%s) in %.2f s", sum(map(len, statuses.values())),
             summary, time.perf_counter() - started)


def _call(client, path):
    try:
        return client.get(path).status
    except Exception as exc:
        log.exception("--warmup: GET %s raised", path)
        raise exits.HaltServer(f"--warmup: GET {path} raised {exc!r} (traceback above); fix "
                               "the application or remove that path", exits.APP_LOAD_ERROR)
