"""Bottle, Flask and Django applications that answer what their framework made
of a POSTed form body: the raw body, its length and the parsed form field
`text` (tests/test_chunked_body_e2e.py). Bottle and Django are wrapped in
wsgiref.validate.validator, so an environ that breaks PEP 3333 fails too;
Flask is not: given wsgi.input_terminated, Werkzeug calls wsgi.input.read()
without a size, which PEP 3333 allows and the validator refuses.

Run as a script, it serves the Bottle app with bottle.run(server="forkserve"):
forkserve's Bottle adapter, this process the master.
"""

import json
from wsgiref.validate import validator

import bottle
import flask


def _answer(body, text):
    return {"length": len(body), "text": text, "body": body.decode("latin-1")}


_bottle = bottle.Bottle()


@_bottle.post("/echo")
def bottle_echo():
    return _answer(bottle.request.body.read(), bottle.request.forms.get("text"))


_flask = flask.Flask(__name__)


@_flask.post("/echo")
def flask_echo():
    body = flask.request.get_data(cache=True)
    return _answer(body, flask.request.form.get("text"))


def _django():
    from django.conf import settings
    settings.configure(DEBUG=False, SECRET_KEY="test-only-not-secret", ALLOWED_HOSTS=["*"],
                       ROOT_URLCONF=__name__, MIDDLEWARE=[], USE_TZ=True)
    from django.core.wsgi import get_wsgi_application
    return get_wsgi_application()


def django_echo(request):
    from django.http import HttpResponse
    body = request.body
    # request.POST parses the body it kept; urlencoded forms only
    return HttpResponse(json.dumps(_answer(body, request.POST.get("text"))),
                        content_type="application/json")


def _urlpatterns():
    from django.urls import path
    return [path("echo", django_echo)]


bottle_app = validator(_bottle)
flask_app = _flask


def __getattr__(name):  # Django is configured only in the process that serves it
    if name == "django_app":
        globals()["django_app"] = app = validator(_django())
        return app
    if name == "urlpatterns":
        globals()["urlpatterns"] = patterns = _urlpatterns()
        return patterns
    raise AttributeError(name)


if __name__ == "__main__":  # the Bottle adapter: this process is the master
    import forkserve.bottle  # noqa: F401  (registers server="forkserve")
    bottle.run(bottle_app, server="forkserve", host="127.0.0.1", port=0, workers=1)
