"""Server hooks: the objects they get and what happens when one raises (no processes)."""

import logging

import pytest

from forkserve import exits
from forkserve.config.settings import Config, parse
from forkserve.process import hooks


class FakeWorker:
    def __init__(self, index):
        self.index = index
        self.requests = 0
        self.app = None
        self.listeners = []


def install(tmp_path, **functions):
    cfg = parse(["-w", "2", "--keep-alive", "4", "a:b"], environ={}, cwd=str(tmp_path))
    return hooks.install(Config(app=cfg.app, values=cfg.values, sources=cfg.sources,
                                hooks=functions))


def test_server_and_worker_objects_offer_what_gunicorn_hooks_use(tmp_path):
    seen = {}

    def pre_fork(server, worker):
        seen.update(pid=server.pid, workers=server.num_workers, keepalive=server.cfg.keepalive,
                    keep_alive=server.cfg.keep_alive, worker_class=server.cfg.worker_class,
                    age=worker.age, log=server.log)
    install(tmp_path, pre_fork=pre_fork).pre_fork(FakeWorker(0))
    import os
    assert seen["pid"] == os.getpid() and seen["workers"] == 2 and seen["age"] == 1
    assert seen["keepalive"] == seen["keep_alive"] == 4.0
    assert seen["worker_class"] == "gevent"
    assert isinstance(seen["log"], logging.Logger)


def test_a_raising_master_hook_stops_the_server_with_its_reason(tmp_path, caplog):
    def when_ready(server):
        raise KeyError("missing")
    installed = install(tmp_path, when_ready=when_ready)
    with pytest.raises(exits.HaltServer) as caught:
        installed.when_ready()
    assert "when_ready hook raised KeyError" in caught.value.reason
    assert "Traceback" in caplog.text


def test_a_raising_post_request_hook_is_logged_and_the_response_stands(tmp_path, caplog):
    def post_request(worker, req, environ, resp):
        raise RuntimeError("metrics down")

    def app(environ, start_response):
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"ok"]
    wrapped = install(tmp_path, post_request=post_request).wrap_app(app)
    body = wrapped({"REQUEST_METHOD": "GET", "PATH_INFO": "/"}, lambda s, h, e=None: None)
    assert b"".join(body) == b"ok"
    body.close()
    assert "Exception in post_request hook" in caplog.text and "metrics down" in caplog.text


def test_post_request_sees_status_headers_and_bytes_sent(tmp_path):
    seen = {}

    def post_request(worker, req, environ, resp):
        seen.update(method=req.method, path=req.path, query=req.query, uri=req.uri,
                    version=req.version, status=resp.status, code=resp.status_code,
                    sent=resp.sent, headers=dict(req.headers))

    def app(environ, start_response):
        start_response("201 Created", [("X-A", "1")])
        yield b"abc"
        yield b"de"
    installed = install(tmp_path, post_request=post_request)
    environ = {"REQUEST_METHOD": "POST", "PATH_INFO": "/p", "QUERY_STRING": "q=1",
               "SERVER_PROTOCOL": "HTTP/1.0", "HTTP_X_TOKEN": "t"}
    body = installed.wrap_app(app)(environ, lambda s, h, e=None: None)
    assert b"".join(body) == b"abcde"
    body.close()
    assert seen == {"method": "POST", "path": "/p", "query": "q=1", "uri": "/p?q=1",
                    "version": (1, 0), "status": "201 Created", "code": 201, "sent": 5,
                    "headers": {"X-TOKEN": "t"}}


def test_a_list_body_stays_a_list_so_the_server_frames_it_with_content_length(tmp_path):
    seen = {}
    installed = install(tmp_path,
                        post_request=lambda worker, req, environ, resp: seen.update(sent=resp.sent))

    def app(environ, start_response):
        start_response("200 OK", [])
        return [b"abc", b"de"]
    body = installed.wrap_app(app)({"REQUEST_METHOD": "GET"}, lambda s, h, e=None: None)
    # forkserve.http.responder sends a list with its Content-Length, in one write;
    # anything else goes out chunked
    assert isinstance(body, list) and body == [b"abc", b"de"]
    body.close()
    assert seen == {"sent": 5}


def test_without_request_hooks_the_application_is_not_wrapped(tmp_path):
    installed = install(tmp_path)

    def app(environ, start_response):
        return []
    assert installed.wrap_app(app) is app
