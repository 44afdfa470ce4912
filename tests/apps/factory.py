def create_app(greeting="hello", punctuation="!"):
    def app(environ, start_response):
        body = f"{greeting}{punctuation}".encode()
        start_response("200 OK", [("Content-Length", str(len(body)))])
        return [body]
    return app


not_callable = {"a": 1}
