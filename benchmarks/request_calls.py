"""Function calls per request on forkserve's HTTP path, source trees side by side.

    python benchmarks/request_calls.py --tree before=/tmp/fs-before --tree after=.
    python benchmarks/request_calls.py --tree after=. --app persondb --top 40
    python benchmarks/request_calls.py --tree before=/tmp/fs-before --tree after=. --opcodes --top 30
    python benchmarks/request_calls.py --tree after=. --new-connections --top 40
    python benchmarks/request_calls.py --tree after=. --uwsgi --top 40

Counts, not times: for each tree it starts `python -m forkserve -w 0` on the
app under a profile hook (sys.setprofile) that is off until told, makes
--warmup keep-alive GET requests on one connection, turns the hook on,
makes --requests more, turns it off and reads what the hook counted: every
Python function call ("call") and every call of a C function from Python
("c_call") in the server process, whatever greenlet made it (the handler's,
the hub's), divided by the requests. A count is exact and does not depend
on the machine's load, so two trees can be compared on a busy machine where
their req/s cannot; what a call costs differs, so a count is a guide to
where time goes, and throughput is measured by http_throughput.py.

With --new-connections each counted request comes on a connection of its
own, with `Connection: close`, as nginx's uwsgi_pass and many proxies send
them: the count then includes what the server does per connection (accept,
the connection's greenlet and objects, the close). --uwsgi sends them as
nginx's uwsgi_pass does, a uwsgi packet on a connection of its own each,
to a uwsgi listener (`-b uwsgi:127.0.0.1:0`).

With --opcodes it counts bytecode instructions instead (sys.settrace with
f_trace_opcodes), per function: the Python work of a request, which the
call counts weigh all alike. Both leave out what C code does inside a call
(a regex, gevent's Cython parts).

The hook is switched with SIGRTMIN (on) and SIGRTMIN+1 (off, and write the
counts), signals forkserve does not use. Prints per tree the calls per
request and, with --top, the functions called most per request, with the
difference to the first tree.
"""

import argparse
import collections
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.harness.servers import HELLO_APP  # noqa: E402
from benchmarks.harness.start import start as start_server  # noqa: E402
from forkserve.http.uwsgi import encode_packet  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent

#: Runs forkserve's __main__ under a profile hook that the two signals switch.
COUNTING = textwrap.dedent('''
    import collections, json, os, runpy, signal, sys

    counts = collections.Counter()
    out = os.environ["CALLS_OUT"]

    def where(frame, event, arg):
        if event == "call":
            code = frame.f_code
            return f"{code.co_qualname} ({os.path.basename(code.co_filename)})"
        return f"{getattr(arg, '__qualname__', repr(arg))} (C)"

    def hook(frame, event, arg):
        if event == "call" or event == "c_call":
            counts[where(frame, event, arg)] += 1

    def opcodes(frame, event, arg):
        if event == "call":
            frame.f_trace_opcodes = True
            frame.f_trace_lines = False
        elif event == "opcode":
            code = frame.f_code
            counts[f"{code.co_qualname} ({os.path.basename(code.co_filename)})"] += 1
        return opcodes

    def on(signum, frame):
        counts.clear()
        if os.environ.get("CALLS_OPCODES"):
            sys.settrace(opcodes)
        else:
            sys.setprofile(hook)

    def off(signum, frame):
        sys.setprofile(None)
        sys.settrace(None)
        with open(out + ".tmp", "w") as f:
            json.dump(counts, f)
        os.rename(out + ".tmp", out)

    signal.signal(signal.SIGRTMIN, on)
    signal.signal(signal.SIGRTMIN + 1, off)
    sys.argv[0] = "forkserve"
    runpy.run_module("forkserve", run_name="__main__", alter_sys=True)
''')

#: Seconds to wait for the counts file after asking for it.
DUMP_TIMEOUT_S = 30.0


def get_many(conn, paths, count):
    """`count` GETs on `conn`, of `paths` in turn; each must be a 200."""
    for i in range(count):
        path = paths[i % len(paths)]
        conn.request("GET", path)
        response = conn.getresponse()
        response.read()
        if response.status != 200:
            raise SystemExit(f"GET {path} answered {response.status}")


def get_each_new(port, paths, count):
    """`count` GETs of `paths` in turn, each on a new connection that the
    server closes after its response; each must be a 200."""
    for i in range(count):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        get_closing(conn, paths[i % len(paths)])
        conn.close()


def get_closing(conn, path):
    conn.request("GET", path, headers={"Connection": "close"})
    response = conn.getresponse()
    response.read()
    if response.status != 200:
        raise SystemExit(f"GET {path} answered {response.status}")


def uwsgi_each_new(port, paths, count):
    """`count` uwsgi requests of `paths` in turn, each on a new connection,
    read to the server's close; each must be a 200."""
    for i in range(count):
        path = paths[i % len(paths)]
        packet = encode_packet([("REQUEST_METHOD", "GET"), ("REQUEST_URI", path),
                                ("PATH_INFO", path), ("QUERY_STRING", ""),
                                ("SERVER_PROTOCOL", "HTTP/1.1"), ("HTTP_HOST", "localhost"),
                                ("REMOTE_ADDR", "127.0.0.1"), ("REMOTE_PORT", "40000"),
                                ("SERVER_NAME", "localhost"), ("SERVER_PORT", "80")])
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(packet)
            response = b""
            while chunk := sock.recv(65536):
                response += chunk
        if not response.startswith(b"HTTP/1.1 200 "):
            raise SystemExit(f"uwsgi GET {path} answered {response[:40]!r}")


def uwsgi_port(server):
    """The port of the server's uwsgi listener, from its log."""
    found = re.search(rb"Listening at: uwsgi://127\.0\.0\.1:(\d+)", server.log())
    if found is None:
        raise SystemExit(f"no uwsgi listener in the server's log: {server.log_path}")
    return int(found.group(1))


def count_calls(tree, app, paths, env, work, args):
    """Counter of calls (function -> calls per request) for one tree."""
    out = work / f"calls-{os.getpid()}-{time.monotonic_ns()}.json"
    environment = dict(os.environ, PYTHONPATH=f"{tree}:{work}:{ROOT}", CALLS_OUT=str(out), **env)
    if args.opcodes:
        environment["CALLS_OPCODES"] = "1"
    argv = [sys.executable, str(work / "counting.py"), "-w", "0", "-b", "127.0.0.1:0",
            *(["-b", "uwsgi:127.0.0.1:0"] if args.uwsgi else []), *args.forkserve_args, app]
    with start_server(argv, log_path=work / "server.log", env=environment, cwd=tree,
                      probe_path=paths[0]) as server:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        # the warmup's first GET opens the connection before the hook goes on: its
        # setup is not counted, only the keep-alive requests after it
        get_many(conn, paths, args.warmup)
        server.group.send_signal(signal.SIGRTMIN)
        if args.uwsgi:
            uwsgi_each_new(uwsgi_port(server), paths, args.requests)
        elif args.new_connections:
            get_each_new(server.port, paths, args.requests)
        else:
            get_many(conn, paths, args.requests)
        server.group.send_signal(signal.SIGRTMIN + 1)
        deadline = time.monotonic() + DUMP_TIMEOUT_S
        while not out.exists():
            if time.monotonic() > deadline:
                raise SystemExit(f"the server wrote no counts within {DUMP_TIMEOUT_S:g} s; "
                                 f"its log: {work / 'server.log'}")
            time.sleep(0.05)
        conn.close()
    counts = json.loads(out.read_text())
    return collections.Counter({name: n / args.requests for name, n in counts.items()})


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tree", action="append", required=True, metavar="NAME=PATH",
                        help="a forkserve source tree (give two to compare: before and after)")
    parser.add_argument("--app", default="hello", choices=("hello", "persondb"))
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=200,
                        help="requests before the count (default 200)")
    parser.add_argument("--top", type=int, default=0,
                        help="also list the N functions called most per request")
    parser.add_argument("--opcodes", action="store_true",
                        help="count bytecode instructions per function instead of calls")
    parser.add_argument("--new-connections", action="store_true",
                        help="a new connection for each counted request (Connection: close)")
    parser.add_argument("--uwsgi", action="store_true",
                        help="count uwsgi requests (as nginx's uwsgi_pass), one per connection")
    parser.add_argument("--forkserve-args", default="",
                        help="more forkserve arguments, e.g. '--access-logfile /dev/null'")
    args = parser.parse_args()
    args.forkserve_args = args.forkserve_args.split()
    trees = dict(t.split("=", 1) for t in args.tree)
    work = Path(tempfile.mkdtemp(prefix="request-calls-"))
    (work / "counting.py").write_text(COUNTING)
    if args.app == "hello":
        app, paths, env = HELLO_APP, ["/"], {}
    else:
        rows = work / "rows.csv"
        subprocess.run([sys.executable, "-m", "examples.persondb.generate", "--rows", "2000",
                        "-o", str(rows)], cwd=ROOT, check=True)
        emails = subprocess.run([sys.executable, "-m", "examples.persondb.generate", "--rows",
                                 "2000", "--emails", "-o", "-"], cwd=ROOT, check=True,
                                capture_output=True, text=True)
        app, env = "examples.persondb.app:app", {"PERSONDB_CSV": str(rows)}
        # one person after the other, as http_throughput.py asks for them
        paths = ["/person/" + email for email in emails.stdout.split()]
    results = {name: count_calls(Path(tree).resolve(), app, paths, env, work, args)
               for name, tree in trees.items()}
    first = next(iter(results.values()))
    kind = ("uwsgi" if args.uwsgi else "new-connection" if args.new_connections
            else "keep-alive")
    for name, counts in results.items():
        python = sum(n for f, n in counts.items() if not f.endswith("(C)"))
        c = sum(n for f, n in counts.items() if f.endswith("(C)"))
        what = (f"{python:7.1f} bytecode instructions" if args.opcodes
                else f"{python:6.1f} Python calls + {c:6.1f} C calls")
        print(f"{name:10} {what} per request "
              f"({args.app}, GET {paths[0]}{' ...' if len(paths) > 1 else ''}, "
              f"{args.requests} {kind} "
              "requests)")
    if args.top:
        for name, counts in results.items():
            print(f"\n{name}: the {args.top} functions "
                  f"{'with the most instructions' if args.opcodes else 'called most'} per request"
                  + ("" if counts is first else " (difference to the first tree)"))
            for function, n in counts.most_common(args.top):
                delta = "" if counts is first else f"  {n - first.get(function, 0):+.2f}"
                print(f"  {n:6.2f}  {function}{delta}")


if __name__ == "__main__":
    main()
