"""Server hooks: Gunicorn's names, arguments and call points.

A Gunicorn config file's `post_fork(server, worker)` and friends run here
unchanged. The objects they get offer what real hooks use: `server.log`,
`server.cfg` (settings by Gunicorn's or forkserve's names), `server.pid`,
`server.num_workers`, `server.proc_name`; `worker.pid`, `worker.ppid`,
`worker.age`, `worker.log`, `worker.cfg`, `worker.nr`, `worker.alive`;
`req.method`, `req.path`, `req.query`, `req.uri`, `req.version`,
`req.headers`; `resp.status`, `resp.status_code`, `resp.headers`,
`resp.sent`.

`install(cfg)` gives the Hooks object that boot passes to the master (or the
single-process server), which passes it to each worker; the call sites are
one-line calls on it. Each method does nothing when its hook is not defined.

A hook that raises is logged with its traceback and then treated as
Gunicorn treats it:
  - master hooks (on_starting, when_ready, pre_fork, on_reload, pre_exec,
    child_exit, nworkers_changed, pre_freeze, post_freeze, pre_retire): the server stops
    (HaltServer); Gunicorn's arbiter dies of the exception too;
  - post_fork, post_worker_init: the worker fails to boot (the exception
    propagates to forkserve.process.worker, which exits WORKER_BOOT_ERROR);
  - pre_request: the request gets a 500 (the application is not called);
  - on_exit: the server still exits, with status 1;
  - post_request, worker_exit, worker_int, worker_abort: logged, and the
    server carries on with what it was doing.
"""

import logging
import os
import signal
import traceback

from forkserve import exits
from forkserve.config import gunicorn

__all__ = ["install", "Hooks", "ServerView", "WorkerView", "ConfigView", "Request",
           "Response"]

log = logging.getLogger("forkserve.error")

class ConfigView:
    """Settings by Gunicorn's names (`cfg.keepalive`) or forkserve's (`cfg.keep_alive`)."""

    def __init__(self, cfg, functions):
        self._cfg = cfg
        self._functions = functions  # the hooks, which Gunicorn's cfg also offers

    def __getattr__(self, name):
        values = self._cfg.values
        if name in values:
            return values[name]
        row = gunicorn.BY_NAME.get(name)
        if row is not None and row.kind == "honoured":
            return self._cfg.app if row.target == "app" else values.get(row.target)
        if row is not None and row.kind == "hook":
            return self._functions.get(name)
        if row is not None:
            return row.harmless[0] if row.harmless else None
        raise AttributeError(f"no setting {name!r}")


class ServerView:
    """What Gunicorn passes as `server` (its Arbiter). Its `pid` is the
    master's (the single process's with -w 0), in the workers' hooks too."""

    def __init__(self, cfg, functions):
        self.cfg = ConfigView(cfg, functions)
        self.log = log
        self.master = None       # forkserve's Master, once it runs
        self.pid = os.getpid()   # the serving process's, again in when_ready
        self.worker_age = 0

    @property
    def num_workers(self):
        return self.master.target if self.master is not None else self.cfg.workers

    @property
    def proc_name(self):
        return self.cfg.name or self.cfg.app


class WorkerView:
    """What Gunicorn passes as `worker`."""

    def __init__(self, worker, age, cfg):
        self._worker = worker
        self.age = age
        self.pid = None          # set after fork
        self.ppid = os.getpid()
        self.cfg = cfg
        self.log = log
        self.booted = False
        self.alive = True
        self.started = 0         # requests begun, counted by the request-hook wrapper

    @property
    def nr(self):
        """Requests this worker has begun, the current one included (as Gunicorn)."""
        return max(self.started, self._worker.requests)

    @property
    def wsgi(self):
        return self._worker.app

    @property
    def sockets(self):
        return self._worker.listeners


class Request:
    """What Gunicorn passes as `req` to pre_request/post_request, from the environ."""

    def __init__(self, environ):
        self.method = environ["REQUEST_METHOD"]
        self.path = environ.get("PATH_INFO", "")
        self.query = environ.get("QUERY_STRING", "")
        self.uri = self.path + ("?" + self.query if self.query else "")
        protocol = environ.get("SERVER_PROTOCOL", "HTTP/1.1")
        major, _, minor = protocol.partition("/")[2].partition(".")
        self.version = (int(major or 1), int(minor or 0))
        self.scheme = environ.get("wsgi.url_scheme", "http")
        self.peer_addr = environ.get("REMOTE_ADDR")
        self.headers = [(key[5:].replace("_", "-"), value) for key, value in environ.items()
                        if key.startswith("HTTP_")]
        for key in ("CONTENT_TYPE", "CONTENT_LENGTH"):
            if key in environ:
                self.headers.append((key.replace("_", "-"), environ[key]))


class Response:
    """What Gunicorn passes as `resp` to post_request."""

    def __init__(self):
        self.status = None
        self.status_code = None
        self.headers = []
        self.sent = 0


# --- installing and calling ---

def install(cfg):
    """The config file's hooks (cfg.hooks), as a Hooks. Called once, at boot.
    --check-config runs none (as Gunicorn's: it starts no server)."""
    return Hooks({} if cfg.check_config else cfg.hooks, cfg)


class Hooks:
    """The hooks of one server: the master (or single process) gets it from
    boot and hands it to each worker it forks.

    `Hooks()` (no configuration) calls nothing: a Master driven by tests, the
    supervisor. The master's table of WorkerViews (`workers`) is cleared in
    a worker, which keeps its own view as `current`.
    """

    def __init__(self, functions=None, cfg=None):
        self.functions = dict(functions or {})
        self.server = ServerView(cfg, self.functions) if cfg is not None else None
        self.workers = {}      # scoreboard index -> WorkerView, in the master
        self.current = None    # this worker's WorkerView, in a worker

    def installed(self, name) -> bool:
        return name in self.functions

    def _master_hook(self, name, *args):
        function = self.functions.get(name)
        if function is None:
            return
        try:
            function(self.server, *args)
        except Exception as exc:
            log.error("Exception in %s hook:\n%s", name, traceback.format_exc())
            raise exits.HaltServer(f"the {name} hook raised {type(exc).__name__}: {exc}; "
                                   "fix the hook in the config file") from None

    def _logged_hook(self, name, *args):
        function = self.functions.get(name)
        if function is None:
            return
        try:
            function(*args)
        except Exception:
            log.error("Exception in %s hook:\n%s", name, traceback.format_exc())

    def on_starting(self):
        self._master_hook("on_starting")

    def when_ready(self, master=None, single=None):
        """Once serving starts, in the process that serves or forks the workers
        (its pid is `server.pid` from now on, in its workers too). With -w 0
        (`single`, the SingleServer) this process is also the worker that
        pre_request/post_request hooks get."""
        if self.server is None:
            return
        self.server.master = master
        self.server.pid = os.getpid()
        if single is not None:
            self.current = WorkerView(single, 1, self.server.cfg)
            self.current.pid, self.current.booted = os.getpid(), True
        self._master_hook("when_ready")

    def pre_freeze(self, app):
        self._master_hook("pre_freeze", app)

    def post_freeze(self):
        self._master_hook("post_freeze")

    def on_reload(self):
        self._master_hook("on_reload")

    def pre_exec(self):
        self._master_hook("pre_exec")

    def pre_retire(self, generation):
        self._master_hook("pre_retire", generation)

    def nworkers_changed(self, new, old):
        self._master_hook("nworkers_changed", new, old)

    def pre_fork(self, worker):
        """In the master, before forking `worker` (forkserve.process.worker.Worker)."""
        if self.server is None:
            return
        self.server.worker_age += 1
        view = self.workers[worker.index] = WorkerView(worker, self.server.worker_age,
                                                       self.server.cfg)
        self._master_hook("pre_fork", view)

    def child_exit(self, index, pid):
        view = self.workers.pop(index, None)
        if view is None or "child_exit" not in self.functions:
            return
        view.pid, view.alive = pid, False
        self._master_hook("child_exit", view)

    def on_exit(self, status):
        """The server's exit status after on_exit: 1 if the hook raised (as Gunicorn)."""
        function = self.functions.get("on_exit")
        if function is None:
            return status
        try:
            function(self.server)
        except Exception:
            log.error("Exception in on_exit hook:\n%s", traceback.format_exc())
            return status or exits.FAILURE
        return status

    def post_fork(self, worker):
        """In the worker, first thing after fork. A raise fails the worker's boot."""
        if self.server is None:
            return
        self.current = (self.workers.get(worker.index)
                        or WorkerView(worker, self.server.worker_age, self.server.cfg))
        self.current.pid = os.getpid()
        self.workers.clear()  # the master's table means nothing here
        function = self.functions.get("post_fork")
        if function is not None:
            function(self.server, self.current)

    def post_worker_init(self, worker):
        """In the worker, once it is set up; a raise fails the worker's boot."""
        if self.current is None:
            return
        self.current.booted = True
        if "worker_abort" in self.functions:
            signal.signal(signal.SIGABRT, self._on_abort)
        function = self.functions.get("post_worker_init")
        if function is not None:
            function(self.current)

    def worker_int(self, worker):
        if self.current is not None:
            self.current.alive = False
            self._logged_hook("worker_int", self.current)

    def _on_abort(self, signum, frame):
        """SIGABRT from the master (--timeout): a Python-level handler, so it runs
        even while the event loop is blocked, which is why the worker timed out."""
        self.worker_abort()
        os._exit(exits.FAILURE)

    def worker_abort(self):
        if self.current is not None:
            self.current.alive = False
            self._logged_hook("worker_abort", self.current)

    def worker_exit(self, worker):
        if self.current is not None and "worker_exit" in self.functions:
            self.current.alive = False
            try:
                self.functions["worker_exit"](self.server, self.current)
            except Exception:
                log.warning("Exception in worker_exit hook:\n%s", traceback.format_exc())

    def wrap_app(self, app):
        """The application, with pre_request/post_request around each request when
        either hook is defined (and the application itself otherwise)."""
        if "pre_request" not in self.functions and "post_request" not in self.functions:
            return app
        return _HookedApp(app, self, self.functions.get("pre_request"),
                          self.functions.get("post_request"))


class _HookedApp:
    def __init__(self, app, hooks, pre, post):
        self.app = app
        self.hooks = hooks  # its `current` is this process's worker, once forked
        self.pre = pre
        self.post = post

    def __call__(self, environ, start_response):
        request = Request(environ)
        worker = self.hooks.current
        if worker is not None:
            worker.started += 1
        if self.pre is not None:
            self.pre(worker, request)  # a raise reaches the handler: 500, logged
        if self.post is None:
            return self.app(environ, start_response)
        response = Response()

        def recording_start_response(status, headers, exc_info=None):
            response.status = status
            response.status_code = int(status.split(None, 1)[0])
            response.headers = list(headers)
            write = start_response(status, headers, exc_info)

            def counting_write(data):
                response.sent += len(data)
                return write(data)
            return counting_write

        try:
            result = self.app(environ, recording_start_response)
        except BaseException:
            self._post(worker, request, environ, response)
            raise
        after = lambda: self._post(worker, request, environ, response)  # noqa: E731
        if isinstance(result, (list, tuple)):
            return _ListBody(result, after, response)
        return _Body(result, after, response)

    def _post(self, worker, request, environ, response):
        try:
            self.post(worker, request, environ, response)
        except Exception:
            log.error("Exception in post_request hook:\n%s", traceback.format_exc())


class _Body:
    """The application's response iterable, counting bytes; close() runs post_request."""

    def __init__(self, result, after, response):
        self.result = result
        self.after = after
        self.response = response

    def __iter__(self):
        for chunk in self.result:
            self.response.sent += len(chunk)
            yield chunk

    def close(self):
        try:
            close = getattr(self.result, "close", None)
            if close is not None:
                close()
        finally:
            self.after()


class _ListBody(list):
    """A list result stays a list, so the server still frames it with its
    Content-Length and sends it in one write; close() runs post_request."""

    def __init__(self, result, after, response):
        super().__init__(result)
        self._result = result
        self._after = after
        self._response = response

    def close(self):
        self._response.sent = sum(len(chunk) for chunk in self)
        try:
            close = getattr(self._result, "close", None)
            if close is not None:
                close()
        finally:
            self._after()
