"""The hello-world WSGI app of benchmarks/hello.py: 13 bytes, no framework.

It does as little as a WSGI app can (one start_response, one body chunk
with its Content-Length), so what a server spends per request beyond it is
the server's own work.
"""

BODY = b"Hello, World!"
HEADERS = [("Content-Type", "text/plain"), ("Content-Length", str(len(BODY)))]


def app(environ, start_response):
    start_response("200 OK", list(HEADERS))
    return [BODY]


application = app
