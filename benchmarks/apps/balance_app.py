"""The small JSON lookup app of benchmarks/balance.py.

A dict of 10,000 records built at import (before the fork: every worker
shares it); each request looks one up by the number in its path (GET / is
record 0) and answers it as JSON, so a request costs a little more than a
hello world and the same in every worker.
"""

import json

RECORDS = {i: {"id": i, "name": f"person {i}", "email": f"p{i}@example.com",
               "score": (i * 7919) % 1000}
           for i in range(10_000)}


def app(environ, start_response):
    key = environ.get("PATH_INFO", "/").strip("/")
    record = RECORDS.get(int(key) % 10_000 if key.isdigit() else 0)
    body = json.dumps(record).encode()
    start_response("200 OK", [("Content-Type", "application/json"),
                              ("Content-Length", str(len(body)))])
    return [body]
