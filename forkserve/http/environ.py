"""The WSGI environ of a request (PEP 3333), as a pure function of the
request head (forkserve.http.protocol.Request) and the part of the environ
that is the same for every request on a connection."""

from urllib.parse import unquote

from forkserve.http.h1 import RequestError, escape

__all__ = ["request_environ"]


def request_environ(base, request):
    """A new environ: `base` (server and connection keys, SCRIPT_NAME
    included), the request's headers and its CGI keys. Raises RequestError
    for a target the server refuses (see h1.request_target) or outside
    SCRIPT_NAME (500, as Gunicorn answers it)."""
    env = base.copy()
    env.update(request.headers)
    path = request.path
    if request.authority is not None:  # RFC 9112 3.2.2: the target's authority wins
        env["HTTP_HOST"] = request.authority
    env["REQUEST_METHOD"] = request.method
    env["SERVER_PROTOCOL"] = request.version
    env["RAW_URI"] = env["REQUEST_URI"] = request.target
    script_name = env["SCRIPT_NAME"]
    if script_name:  # mounted under a prefix: as Gunicorn, raw bytes compared, 500 outside
        if not path.startswith(script_name):
            raise RequestError(500, f"request path {escape(path[:60])} does not start with "
                                    f"SCRIPT_NAME {escape(script_name)} (the proxy in front "
                                    "must forward only paths under it)")
        path = path[len(script_name):]
    env["PATH_INFO"] = unquote(path, "latin-1") if "%" in path and not request.decoded else path
    env["QUERY_STRING"] = request.query
    return env
