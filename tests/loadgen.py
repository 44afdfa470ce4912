"""A small pipelined HTTP/1.1 load generator for tests (loopback only).

Python's http.client manages a few thousand requests a second; proving that
workers stay shared needs every record of a 100,000-row dataset requested,
so this client keeps `depth` requests in flight on each of a few keep-alive
connections and parses only the status line and Content-Length.
"""

import selectors
import socket


def blast(port, paths, *, connections=4, depth=64, host="127.0.0.1", timeout=60):
    """GET every path once; return {status: count}. Raises on a protocol error."""
    paths = list(paths)
    share = [paths[i::connections] for i in range(connections)]
    statuses = {}
    selector = selectors.DefaultSelector()
    conns = []
    for chunk in share:
        if not chunk:
            continue
        sock = socket.create_connection((host, port), timeout=timeout)
        sock.setblocking(False)
        conn = {"sock": sock, "todo": chunk, "next": 0, "pending": 0, "out": b"", "in": b""}
        conns.append(conn)
        selector.register(sock, selectors.EVENT_READ | selectors.EVENT_WRITE, conn)
    try:
        while conns:
            events = selector.select(timeout)
            if not events:
                raise TimeoutError(f"no progress in {timeout}s")
            for key, mask in events:
                conn = key.data
                if mask & selectors.EVENT_WRITE:
                    _fill(conn, depth)
                    if conn["out"]:
                        sent = conn["sock"].send(conn["out"])
                        conn["out"] = conn["out"][sent:]
                if mask & selectors.EVENT_READ:
                    data = conn["sock"].recv(262144)
                    if not data:
                        raise ConnectionError("server closed a keep-alive connection")
                    conn["in"] += data
                    _parse(conn, statuses)
                if conn["next"] == len(conn["todo"]) and conn["pending"] == 0:
                    selector.unregister(conn["sock"])
                    conn["sock"].close()
                    conns.remove(conn)
                elif not conn["out"] and conn["next"] == len(conn["todo"]):
                    selector.modify(conn["sock"], selectors.EVENT_READ, conn)
    finally:
        for conn in conns:
            conn["sock"].close()
        selector.close()
    return statuses


def _fill(conn, depth):
    while conn["pending"] < depth and conn["next"] < len(conn["todo"]):
        path = conn["todo"][conn["next"]]
        conn["out"] += f"GET {path} HTTP/1.1\r\nHost: t\r\n\r\n".encode()
        conn["next"] += 1
        conn["pending"] += 1


def _parse(conn, statuses):
    buffer = conn["in"]
    while True:
        end = buffer.find(b"\r\n\r\n")
        if end < 0:
            break
        head = buffer[:end].split(b"\r\n")
        status = int(head[0].split()[1])
        length = 0
        for line in head[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        if len(buffer) < end + 4 + length:
            break
        buffer = buffer[end + 4 + length:]
        statuses[status] = statuses.get(status, 0) + 1
        conn["pending"] -= 1
    conn["in"] = buffer
