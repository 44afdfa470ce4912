"""What a server behind a proxy made of a request, as JSON: the scheme, the
host, the forwarded client, and the peer (the proxy's connection)."""

import json

KEYS = ("wsgi.url_scheme", "HTTP_HOST", "HTTP_X_FORWARDED_FOR", "REMOTE_ADDR", "REMOTE_PORT")


def app(environ, start_response):
    data = json.dumps({key: environ.get(key) for key in KEYS}).encode()
    start_response("200 OK", [("Content-Type", "application/json"),
                              ("Content-Length", str(len(data)))])
    return [data]
