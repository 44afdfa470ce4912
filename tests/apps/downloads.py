"""Large responses on each of the server's write paths, for slow readers
(tests/test_slow_readers_e2e.py):

  /whole/N    N bytes returned in a list (one whole response: held in the
              Outbox, or one send with --no-batch-responses)
  /stream/N   N bytes yielded 256 KiB at a time, with a Content-Length
  /file/N     the first N bytes of the file $SENT_FILE, by wsgi.file_wrapper
              (os.sendfile)
  /small      b"ok"
"""

import os

CHUNK = 256 * 1024


def app(environ, start_response):
    kind, _, size = environ["PATH_INFO"].strip("/").partition("/")
    if kind == "small":
        start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", "2")])
        return [b"ok"]
    size = int(size)
    start_response("200 OK", [("Content-Type", "application/octet-stream"),
                              ("Content-Length", str(size))])
    if kind == "whole":
        return [b"w" * size]
    if kind == "stream":
        return _stream(size)
    if kind == "file":
        return environ["wsgi.file_wrapper"](open(os.environ["SENT_FILE"], "rb"), CHUNK)
    raise ValueError(f"no such download: {kind}")


def _stream(size):
    chunk = b"s" * CHUNK
    while size > 0:
        yield chunk[:size]
        size -= CHUNK
