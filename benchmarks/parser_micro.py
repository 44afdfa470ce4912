"""CPU per request head: forkserve's h1 grammar against httptools (llhttp).

    python benchmarks/parser_micro.py            # needs: pip install httptools
    python benchmarks/parser_micro.py --cpu 0    # pinned

Parses the same request heads in a loop in one process, no sockets: wrk's
(request line + Host) and a browser-like one (10 fields). For h1, the
head is split into lines and every line goes through request_line() /
header_field(), which is what forkserve.http's handler does after its
readline()s (the readline calls themselves are not counted). For
httptools, one HttpRequestParser per connection (reused across its
requests, as uvicorn does) is fed the whole head, with callbacks that
collect the URL and the fields. Neither number includes building the
WSGI environ. The median of 5 batches, CPU time per head.

This measures only parsing. How much of a request it is: see
benchmarks/hotpath.py, whose py-spy window puts the grammar's share of a
whole request. Whether llhttp keeps every strictness guarantee of the test
corpus (tests/httpcorpus.py) is a separate question this does not answer.
"""

import argparse
import json
import os
import statistics
import sys
import time

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.harness.machine import Conditions  # noqa: E402
from benchmarks.harness.results import write_result  # noqa: E402
from forkserve.http import h1  # noqa: E402

HEADS = {
    "wrk": b"GET / HTTP/1.1\r\nHost: 127.0.0.1:8000\r\n\r\n",
    "browser": (b"GET /person/someone%40example.com?fields=name HTTP/1.1\r\n"
                b"Host: persondb.example.com\r\n"
                b"User-Agent: Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0\r\n"
                b"Accept: text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8\r\n"
                b"Accept-Language: en-GB,en;q=0.5\r\n"
                b"Accept-Encoding: gzip, deflate, br\r\n"
                b"Connection: keep-alive\r\n"
                b"Cookie: session=0123456789abcdef0123456789abcdef; theme=dark\r\n"
                b"Upgrade-Insecure-Requests: 1\r\n"
                b"Sec-Fetch-Dest: document\r\n"
                b"Sec-Fetch-Mode: navigate\r\n\r\n"),
}


def parse_h1(head, limits=h1.Limits()):
    lines = head.split(b"\r\n")
    line_max, size_max = limits.line_max, limits.field_size_max
    result = [h1.request_line(lines[0] + b"\r\n", line_max)]
    for line in lines[1:-2]:
        result.append(h1.header_field(line + b"\r\n", size_max))
    return result


def make_httptools():
    import httptools

    class Collect:
        def __init__(self):
            self.url, self.fields, self.done = None, [], False

        def on_url(self, url):
            self.url = url

        def on_header(self, name, value):
            self.fields.append((name, value))

        def on_headers_complete(self):
            self.done = True

    collect = Collect()
    parser = httptools.HttpRequestParser(collect)

    def parse(head):
        collect.fields = []
        parser.feed_data(head)
        return parser.get_method(), collect.url, parser.get_http_version(), collect.fields

    return parse


def per_call_us(func, head, calls):
    for _ in range(calls // 10):
        func(head)
    batches = []
    for _ in range(5):
        started = time.process_time()
        for _ in range(calls):
            func(head)
        batches.append((time.process_time() - started) / calls * 1e6)
    return statistics.median(batches)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=50_000)
    p.add_argument("--cpu", type=int, help="pin to this CPU")
    p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                 "results", "parser_micro"),
                   help="where result.json goes (%(default)s)")
    args = p.parse_args(argv)
    conditions = Conditions()
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    parsers = {"forkserve h1": parse_h1}
    try:
        parsers["httptools (llhttp)"] = make_httptools()
    except ImportError:
        print("httptools is not installed (pip install httptools): h1 only", file=sys.stderr)
    results = {name: {head_name: per_call_us(parse, head, args.calls)
                      for head_name, head in HEADS.items()}
               for name, parse in parsers.items()}
    print(f"Python {sys.version.split()[0]}, µs CPU per head (median of 5 x {args.calls:,}):\n")
    print("| parser | " + " | ".join(f"{name} ({len(head)} B)" for name, head in HEADS.items())
          + " |")
    print("|---|" + "---:|" * len(HEADS))
    for name, row in results.items():
        print(f"| {name} | " + " | ".join(f"{row[h]:.2f}" for h in HEADS) + " |")
    print("\n" + json.dumps(results))
    rows = [{"parser": name, "head": head, "head_bytes": len(HEADS[head]), "cpu_us": us}
            for name, row in results.items() for head, us in row.items()]
    write_result("parser_micro.py", argv, rows, conditions, args.out,
                 title=f"request heads, median of 5 x {args.calls:,}",
                 versions={"python": sys.version.split()[0]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
