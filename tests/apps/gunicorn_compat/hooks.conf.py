# A Gunicorn config file as a Django project has it: settings under
# Gunicorn's names and server hooks that leave a file per call in $HOOK_DIR.
import json
import os

workers = 2
worker_class = "gevent"
preload_app = True
keepalive = 5
loglevel = "info"
raw_env = ["SITE_COLOUR=teal"]
forwarded_allow_ips = "127.0.0.1,::1"


def _record(name, **facts):
    path = os.path.join(os.environ["HOOK_DIR"], f"{name}.{os.getpid()}")
    with open(path, "a") as handle:
        handle.write(json.dumps(facts) + "\n")


def on_starting(server):
    _record("on_starting", pid=server.pid, workers=server.cfg.workers)


def when_ready(server):
    server.log.info("when_ready hook: %d workers", server.num_workers)
    _record("when_ready", pid=server.pid, num_workers=server.num_workers)


def pre_fork(server, worker):
    _record("pre_fork", age=worker.age)


def post_fork(server, worker):
    _record("post_fork", pid=worker.pid, age=worker.age, ppid=worker.ppid,
            keepalive=server.cfg.keepalive, server_pid=server.pid)


def post_worker_init(worker):
    _record("post_worker_init", pid=worker.pid, booted=worker.booted)


def pre_request(worker, req):
    _record("pre_request", method=req.method, path=req.path, query=req.query)


def post_request(worker, req, environ, resp):
    _record("post_request", path=req.path, status=resp.status_code, sent=resp.sent,
            scheme=environ["wsgi.url_scheme"], nr=worker.nr)


def worker_int(worker):
    _record("worker_int", pid=worker.pid)


def worker_exit(server, worker):
    _record("worker_exit", pid=worker.pid, server_pid=server.pid)


def child_exit(server, worker):
    _record("child_exit", pid=worker.pid)


def nworkers_changed(server, new_value, old_value):
    _record("nworkers_changed", new=new_value, old=old_value)


def post_freeze(server):
    _record("post_freeze", pid=server.pid)


def on_exit(server):
    _record("on_exit", pid=server.pid)


def on_reload(server):
    _record("on_reload", pid=server.pid)


def pre_exec(server):
    _record("pre_exec", pid=server.pid)


def pre_retire(server, generation):
    _record("pre_retire", pid=server.pid, generation=generation)


def worker_abort(worker):
    _record("worker_abort", pid=worker.pid)
