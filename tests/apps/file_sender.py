"""Serves a regular file through wsgi.file_wrapper and says how it went out:
GET /file sends the file named by $SENT_FILE; GET /reads answers how many times the server called the
file's read() (0 when the kernel sent it with sendfile(), which never calls
read()). For tests/test_sendfile_e2e.py; serve with -w 0 (one process)."""

import io
import os

reads = 0


class _CountedFile(io.FileIO):
    def read(self, size=-1):
        global reads
        reads += 1
        return super().read(size)


def app(environ, start_response):
    if environ["PATH_INFO"] == "/reads":
        body = str(reads).encode()
        start_response("200 OK", [("Content-Type", "text/plain"),
                                  ("Content-Length", str(len(body)))])
        return [body]
    start_response("200 OK", [("Content-Type", "application/octet-stream")])
    return environ["wsgi.file_wrapper"](_CountedFile(os.environ["SENT_FILE"]), 65536)
