"""HTTP/1.x for the workers.

h1          the RFC 9112 grammar of one line and the body framing, pure functions
protocol    one HTTP/1.1 connection without I/O: bytes in, events out; response
            parts in, bytes out (framing, limits, keep-alive, 100-continue, trailers)
uwsgi       one uwsgi-protocol connection (nginx's uwsgi_pass) without I/O: the same
            events and response framing, the request head read from a uwsgi packet
environ     the WSGI environ of a request, pure
body        wsgi.input over the connection object's body events
response    start_response checks and the response head, pure
responder   the WSGI response: start_response, write, sending the result, sendfile
transport   the socket side of a connection: reads, sends, timers, lingering close
handler     one connection: drives the connection object over its transport
server      the per-worker gevent server: accept, cap connections, drain
accesslog   Gunicorn's access_log_format, pure
proxy       forwarded_allow_ips, secure_scheme_headers, PROXY protocol v1/v2
stats       the master's --stats endpoint (JSON and Prometheus)
"""
