"""Bottle and Flask applications that read the request body and, as
frameworks do, catch what reading raises and answer 500 themselves (and
print the traceback to wsgi.errors): tests/test_body_refusal_e2e.py."""

import bottle
import flask

bottle_app = bottle.Bottle()


@bottle_app.post("/upload")
def bottle_upload():
    return {"received": len(bottle.request.body.read())}


flask_app = flask.Flask(__name__)


@flask_app.post("/upload")
def flask_upload():
    return {"received": len(flask.request.get_data())}
