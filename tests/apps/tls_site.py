"""A small app for the TLS tests: /scheme answers wsgi.url_scheme, /echo the body."""

from wsgiref.validate import validator


def _app(environ, start_response):
    if environ["PATH_INFO"] == "/echo":
        body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
    else:
        body = environ["wsgi.url_scheme"].encode()
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]


app = validator(_app)
