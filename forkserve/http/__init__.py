"""HTTP/1.x for the workers.

h1       the RFC 9112 grammar and body framing, pure functions of bytes
handler  one connection: read a request, run the WSGI app, write the response
server   the per-worker gevent server: accept, cap connections, drain
stats    the master's --stats endpoint (JSON and Prometheus)
"""
