"""Apps for benchmarks/worker_gc.py: a preloaded dataset, and requests that
leave cyclic garbage behind.

GCAPP picks the app: ``probe`` (a plain WSGI app whose every request leaves
an exception with its traceback and two dicts that point at each other),
``flask`` or ``django`` (a JSON view, as each framework serves it). Every app
first builds GCAPP_ROWS small dicts in the master (the dataset, frozen by
forkserve before the fork) that requests never read: any page of it that a
worker copies was copied by the garbage collector, not by the application.
"""

import json
import os

DATASET = [{"id": n, "name": f"person {n}", "tags": ["a", "b"]}
           for n in range(int(os.environ.get("GCAPP_ROWS", "200000")))]

_KIND = os.environ.get("GCAPP", "probe")


def _cyclic_garbage():
    try:
        raise ValueError("kept with its traceback")
    except ValueError as exc:
        error = exc  # error -> traceback -> this frame -> error: a cycle
    left, right = {"payload": bytearray(1024)}, {}
    left["other"], right["other"] = right, left
    return error is not None


def _probe(environ, start_response):
    _cyclic_garbage()
    body = json.dumps({"rows": len(DATASET)}).encode()
    start_response("200 OK", [("Content-Type", "application/json"),
                              ("Content-Length", str(len(body)))])
    return [body]


def _flask():
    import flask

    application = flask.Flask(__name__)

    @application.route("/")
    def index():
        return flask.jsonify(rows=len(DATASET))

    return application


def _django():
    import django
    from django.conf import settings
    from django.http import JsonResponse
    from django.urls import path

    def index(request):
        return JsonResponse({"rows": len(DATASET)})

    settings.configure(DEBUG=False, ALLOWED_HOSTS=["*"], ROOT_URLCONF=__name__,
                       SECRET_KEY="benchmark only", MIDDLEWARE=[], INSTALLED_APPS=[])
    globals()["urlpatterns"] = [path("", index)]
    django.setup()
    from django.core.wsgi import get_wsgi_application
    return get_wsgi_application()


app = {"probe": lambda: _probe, "flask": _flask, "django": _django}[_KIND]()
