"""A Flask application, as a Gunicorn user would serve it."""

import os

from flask import Flask, request

app = Flask(__name__)


@app.route("/hello")
def hello():
    return "hello from flask\n"


@app.route("/scheme")
def scheme():
    return request.scheme


@app.route("/remote")
def remote():
    return f"{request.environ['REMOTE_ADDR']} {request.environ.get('REMOTE_PORT')}"


@app.route("/environ/<name>")
def environ(name):
    return os.environ.get(name, "")


@app.route("/created", methods=["POST"])
def created():
    return "made", 201, {"X-Made": "yes", "Content-Type": "text/plain"}


@app.route("/print")
def printed():
    print("printed by the application", flush=True)
    return "ok"


@app.route("/block")
def block():
    from gevent import monkey
    monkey.get_original("time", "sleep")(30)  # blocks the worker's event loop
    return "unblocked"


def mounted(environ, start_response):
    """Where the server mounted this application (SCRIPT_NAME) and the rest of the path."""
    import json
    body = json.dumps({"mounted": f"{environ['SCRIPT_NAME']} {environ['PATH_INFO']}"}).encode()
    start_response("200 OK", [("Content-Type", "application/json"),
                              ("Content-Length", str(len(body)))])
    return [body]
