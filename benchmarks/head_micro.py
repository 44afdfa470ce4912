"""CPU per request head taken from forkserve's read buffer, no sockets:
one readline() per line (the way for a head not wholly buffered) against
Reader.head_lines() (one split of a head that is). Lines only: parsing
them (request_line, header_field) costs the same either way.

    python benchmarks/head_micro.py

Median of 7 batches of 10,000 heads, CPU time per head (3 lines: request
line, Host, User-Agent, then the blank line).
"""

import os
import socket
import statistics
import sys
import time
from functools import partial

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gevent import get_hub  # noqa: E402

from forkserve.http.connection import Reader  # noqa: E402

HEAD = b"GET / HTTP/1.1\r\nHost: 127.0.0.1:8000\r\nUser-Agent: wrk\r\n\r\n"
HEADS = 200


def by_readline(reader):
    reader._data, reader._pos = HEAD * HEADS, 0
    for _ in range(HEADS):
        partial(reader.readline, 4096)()
        field_line = partial(reader.readline, 8190)
        while field_line() != b"\r\n":
            pass


def by_head_lines(reader):
    reader._data, reader._pos = HEAD * HEADS, 0
    for _ in range(HEADS):
        next_line = iter(reader.head_lines(4096)).__next__
        next_line()
        while next_line() != b"\r\n":
            pass


def main():
    ours, _theirs = socket.socketpair()
    reader = Reader(ours.fileno(), get_hub().loop)
    for way in (by_readline, by_head_lines) * 2:  # the first pair warms up
        times = []
        for _ in range(7):
            start = time.process_time()
            for _ in range(50):
                way(reader)
            times.append((time.process_time() - start) / (50 * HEADS) * 1e6)
        print(f"{way.__name__}: {statistics.median(times):.2f} µs per head")


if __name__ == "__main__":
    main()
