"""HTTP/1.x for the workers.

h1          the RFC 9112 grammar and body framing, pure functions of bytes
body        wsgi.input: reads exactly the framed request body
response    start_response checks and the response head, pure
responder   the response side: start_response, write, framing, sendfile
connection  the socket side of a connection: buffered reads, sends, timers, close
handler     one connection: read a request, run the WSGI app, write the response
server      the per-worker gevent server: accept, cap connections, drain
accesslog   Gunicorn's access_log_format, pure
proxy       forwarded_allow_ips, secure_scheme_headers, PROXY protocol v1/v2
stats       the master's --stats endpoint (JSON and Prometheus)
"""
