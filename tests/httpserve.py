"""Run a forkserve.server.Server around a validator-wrapped test app.

Used by tests/test_http.py in a subprocess: binds 127.0.0.1 port 0, prints
"PORT <n>" on stdout, serves until SIGTERM, then drains (printing
"DRAINED <True|False> <seconds>") and exits; on SIGINT it calls close_now()
(printing "CLOSED") and exits. The listener deliberately lacks
TCP_NODELAY so /nodelay shows what the server set on the accepted socket.
"""

from gevent import monkey

monkey.patch_all()

import argparse  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from urllib.parse import parse_qs  # noqa: E402
from wsgiref.validate import WSGIWarning, validator  # noqa: E402

import gevent  # noqa: E402
from gevent.event import Event  # noqa: E402

from forkserve.http.handler import Handler, Limits  # noqa: E402
from forkserve.http.server import Server  # noqa: E402
from forkserve.http.transport import Outbox  # noqa: E402

ENVIRON_KEYS = ("RAW_URI", "REQUEST_URI", "SERVER_NAME", "SERVER_PORT", "SERVER_SOFTWARE", "SERVER_PROTOCOL",
                "REQUEST_METHOD", "PATH_INFO", "QUERY_STRING", "REMOTE_ADDR",
                "CONTENT_LENGTH", "CONTENT_TYPE", "wsgi.multithread", "wsgi.multiprocess")


BLOCK = b"x" * 65536
SERVER = None
COMPLETED = 0  # responses reported through on_request


def count_request():
    global COMPLETED
    COMPLETED += 1


def app(environ, start_response):
    path = environ["PATH_INFO"]
    query = {k: v[0] for k, v in parse_qs(environ["QUERY_STRING"], keep_blank_values=True).items()}
    text = [("Content-Type", "text/plain")]
    if path == "/echo":
        parts = []
        while True:
            data = environ["wsgi.input"].read(8192)
            if not data:
                break
            parts.append(data)
        body = b"".join(parts)
        start_response("200 OK", text + [("Content-Length", str(len(body)))])
        return [body]
    if path == "/boom":
        raise RuntimeError("boom from the test app")
    if path == "/boom-late":
        start_response("200 OK", text)
        return boom_late()
    if path == "/slow":
        chunks, delay = int(query.get("chunks", 5)), float(query.get("delay", 0.2))
        start_response("200 OK", text + [("Content-Length", str(chunks * 6))])
        return slow_body(chunks, delay)
    if path == "/slow-start":
        gevent.sleep(float(query.get("delay", 0.5)))
        start_response("200 OK", text + [("Content-Length", "4")])
        return [b"done"]
    if path.startswith("/environ"):
        found = {k: environ[k] for k in ENVIRON_KEYS if k in environ}
        found.update({k: v for k, v in environ.items() if k.startswith("HTTP_")})
        body = json.dumps(found).encode()
        start_response("200 OK", [("Content-Type", "application/json")])
        return [body]
    if path == "/counters":
        body = json.dumps({"active": SERVER.active_requests, "open": SERVER.open_connections,
                           "completed": COMPLETED}).encode()
        start_response("200 OK", [("Content-Type", "application/json")])
        return [body]
    if path == "/drain-inside":
        try:
            SERVER.drain(1)
        except RuntimeError as ex:
            body = str(ex).encode()
        start_response("200 OK", text)
        return [body]
    if path == "/nodelay":
        start_response("200 OK", text)
        return [environ["forkserve.test.nodelay"].encode()]
    if path == "/generator":
        start_response("200 OK", text)
        return (part for part in (b"gen", b"erated"))
    if path == "/twice":  # PEP 3333: a second call without exc_info is an error
        start_response("200 OK", text)
        try:
            start_response("201 Created", text)
        except Exception:
            if query.get("swallow"):
                return [b"swallowed"]
            raise
        return [b"twice"]
    if path == "/replace":  # an error handler replacing headers not yet sent
        start_response("200 OK", text)
        try:
            raise ValueError("replaced")
        except ValueError:
            start_response("503 Service Unavailable", text, sys.exc_info())
        return [b"replaced"]
    if path == "/late-exc-info":  # exc_info once the headers went out: re-raised
        write = start_response("200 OK", text)
        write(b"first")
        try:
            raise ValueError("late error")
        except ValueError:
            start_response("500 Internal Server Error", text, sys.exc_info())
        return [b"never"]
    if path == "/write":
        write = start_response("200 OK", text)
        write(b"written ")
        return [b"and returned"]
    if path == "/header":
        start_response("200 OK", text + [(query["name"], query["value"])])
        return [b"bad"]
    if path == "/status":
        start_response(query["status"], text + [("Content-Length", "4")])
        return [b"body"]
    if path == "/file":
        body = open(query["path"], "rb")
        start_response("200 OK", text)
        return environ["wsgi.file_wrapper"](body)
    if path == "/big":  # for clients that do not read: far more than socket buffers hold
        blocks = int(query.get("mib", 64)) * 16
        start_response("200 OK", text + [("Content-Length", str(blocks * len(BLOCK)))])
        return (BLOCK for _ in range(blocks))
    if path == "/short":  # declares more than it sends
        start_response("200 OK", text + [("Content-Length", "10")])
        return [b"short"]
    start_response("200 OK", text)
    return [b"ok"]


#: Served without the validator: OPTIONS * (PATH_INFO "*", as Gunicorn gives
#: it, is one the validator does not know) and the routes that break the WSGI
#: contract on purpose, to see what the server (not the validator) does, and
#: /file, whose wsgi.file_wrapper result the validator would hide.
UNCHECKED = frozenset({"*", "/twice", "/late-exc-info", "/header", "/status", "/file"})


def checked(app):
    """`app` behind wsgiref's validator, except for the UNCHECKED paths."""
    validated = validator(app)

    def dispatch(environ, start_response):
        if environ["PATH_INFO"] in UNCHECKED:
            return app(environ, start_response)
        return validated(environ, start_response)
    return dispatch


def boom_late():
    yield b"partial"
    raise RuntimeError("boom after the headers went out")


def slow_body(chunks, delay):
    for i in range(chunks):
        gevent.sleep(delay)
        yield b"chunk%d" % (i % 10)


class ProbeHandler(Handler):
    """Exposes the accepted socket's TCP_NODELAY to the app (tests only)."""

    def __init__(self, sock, address, server):
        super().__init__(sock, address, server)
        if sock.family != socket.AF_UNIX:
            flag = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
            self.base_env["forkserve.test.nodelay"] = str(flag)


def file_logger(name, path):
    logger = logging.getLogger(name)
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    return logger


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--access-log")
    parser.add_argument("--error-log", required=True)
    parser.add_argument("--worker-connections", type=int, default=50)
    parser.add_argument("--drain-timeout", type=float, default=5.0)
    parser.add_argument("--unix", help="listen on this AF_UNIX path instead of 127.0.0.1")
    parser.add_argument("--server-name")
    parser.add_argument("--batch-responses", type=int, default=0,
                        help="1: write whole responses at the end of the loop's pass (an Outbox)")
    for field in Limits.__dataclass_fields__.values():
        parser.add_argument("--" + field.name.replace("_", "-"), type=type(field.default),
                            default=field.default)
    args = parser.parse_args()
    warnings.simplefilter("ignore", WSGIWarning)  # fuzzed methods are "unknown"

    limits = Limits(**{name: getattr(args, name) for name in Limits.__dataclass_fields__})
    if args.unix:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(args.unix)
    else:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
    listener.listen(128)
    access_log = file_logger("test.access", args.access_log) if args.access_log else None
    global SERVER
    SERVER = server = Server(listener, checked(app), worker_connections=args.worker_connections,
                             limits=limits, on_request=count_request, access_log=access_log,
                             server_name=args.server_name,
                             error_log=file_logger("test.error", args.error_log),
                             outbox=Outbox(gevent.get_hub().loop) if args.batch_responses
                             else None)
    server.handler_class = ProbeHandler
    server.start()
    print("PORT", 0 if args.unix else listener.getsockname()[1], flush=True)

    stopped = Event()

    def drain():
        started = time.monotonic()
        finished = server.drain(args.drain_timeout)
        print("DRAINED", finished, round(time.monotonic() - started, 3), flush=True)
        stopped.set()

    def close_now():
        server.close_now()
        print("CLOSED", flush=True)
        stopped.set()

    gevent.signal_handler(signal.SIGTERM, gevent.spawn, drain)
    gevent.signal_handler(signal.SIGINT, gevent.spawn, close_now)
    stopped.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
