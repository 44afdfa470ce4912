"""A Falcon application, as a Gunicorn user would serve it."""

import falcon


class Hello:
    def on_get(self, req, resp):
        resp.content_type = falcon.MEDIA_TEXT
        resp.text = "hello from falcon\n"


class Scheme:
    def on_get(self, req, resp):
        resp.content_type = falcon.MEDIA_TEXT
        resp.text = req.scheme


app = falcon.App()
app.add_route("/hello", Hello())
app.add_route("/scheme", Scheme())
