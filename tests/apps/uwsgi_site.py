"""The app behind nginx's uwsgi_pass in the uwsgi tests (and pyuwsgi beside
forkserve): what the server made of a request, a request body echoed, a
large response with and without a Content-Length. Checked by wsgiref.validate."""

import ctypes
import hashlib
import json
import os
from wsgiref.validate import validator

#: environ keys both servers must agree on
KEYS = ("REQUEST_METHOD", "PATH_INFO", "QUERY_STRING", "REQUEST_URI", "SERVER_PROTOCOL",
        "CONTENT_TYPE", "CONTENT_LENGTH", "HTTP_HOST", "HTTP_USER_AGENT", "HTTP_COOKIE",
        "HTTP_X_TAG", "REMOTE_ADDR", "SERVER_NAME", "SERVER_PORT", "SCRIPT_NAME",
        "wsgi.url_scheme")


def _getenv(name):
    """The process environment's value, as the C library has it: pyuwsgi applies
    uWSGI's env = after Python started, so os.environ does not show it."""
    value = _LIBC.getenv(name)
    return None if value is None else value.decode()


_LIBC = ctypes.CDLL(None)
_LIBC.getenv.restype = ctypes.c_char_p


def _app(environ, start_response):
    name = environ["PATH_INFO"].rsplit("/", 1)[-1]
    if name in ("big", "big-length"):
        size = int(environ.get("QUERY_STRING") or 1_000_000)
        block = bytes(range(256)) * 256
        chunks = [block[:min(len(block), size - done)] for done in range(0, size, len(block))]
        headers = [("Content-Type", "application/octet-stream")]
        if name == "big-length":
            headers.append(("Content-Length", str(size)))
        start_response("200 OK", headers)
        return chunks
    body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
    found = {key: environ.get(key) for key in KEYS}
    found.update(body_length=len(body), body_sha1=hashlib.sha1(body).hexdigest(),
                 pid=os.getpid(), setting=_getenv(b"DJANGO_SETTINGS_MODULE"))
    data = json.dumps(found, sort_keys=True).encode()
    start_response("200 OK", [("Content-Type", "application/json"),
                              ("Content-Length", str(len(data)))])
    return [data]


app = application = validator(_app)
#: the same, unchecked, for uWSGI: it leaves SCRIPT_NAME out of the environ
#: when nginx sends none, and wsgiref.validate then fails on it
plain = _app
