"""Echo what the server made of a request, as JSON (for the RFC corpus)."""

import json

KEYS = ("REQUEST_METHOD", "PATH_INFO", "QUERY_STRING", "HTTP_HOST", "CONTENT_TYPE",
        "SERVER_PROTOCOL", "RAW_URI")


def app(environ, start_response):
    body = environ["wsgi.input"].read()
    found = {key: environ.get(key) for key in KEYS}
    found["body"] = body.decode("latin-1")
    data = json.dumps(found).encode()
    start_response("200 OK", [("Content-Type", "application/json"),
                              ("Content-Length", str(len(data)))])
    return [data]
