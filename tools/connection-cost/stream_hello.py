"""A minimal gevent StreamServer answering every request with hello world and closing."""
import sys
from gevent.server import StreamServer
RESP = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 13\r\nConnection: close\r\n\r\nHello, World!"
def handle(sock, addr):
    data = sock.recv(65536)
    if data:
        sock.sendall(RESP)
    sock.close()
server = StreamServer(("127.0.0.1", 0), handle)
server.start()
print("127.0.0.1:%d" % server.server_port, flush=True)
server.serve_forever()
