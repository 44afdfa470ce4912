"""The `forkserve memory` command: find the server, read it, show it.

The server is named by a pid or its pid file (we read /proc ourselves), or
by its stats endpoint, which serves forkserve.memory.to_json() and is read
back with from_json(); unnamed, it is found by its process title
(forkserve.memory.find). Every failure to find the server ends in a message
saying what to do next, and exit status 1; usage errors exit 2.
"""

import argparse
import functools
import http.client
import ipaddress
import json
import math
import socket
import sys
import time
import urllib.parse

from forkserve.memory import find, procfs
from forkserve.memory.model import collect, discover
from forkserve.memory.render import format_table, headline
from forkserve.memory.report_json import from_json, to_json

#: Seconds to wait for the stats endpoint. It answers from memory, so
#: anything slower means a wrong address or a stuck master.
STATS_TIMEOUT = 2.0


class ServerNotFound(Exception):
    """The server could not be found or read; the message says what to do."""


def main(argv=None):
    """`forkserve memory [TARGET] [--why [TARGET]] [--json] [--watch SECONDS]`.

    Returns 0 on success, 1 when the server cannot be found or read, 2 on
    a usage error.
    """
    try:
        args = _parse_args(sys.argv[1:] if argv is None else argv)
    except SystemExit as exc:  # argparse printed the usage or --help
        return exc.code
    try:
        if args.why is not None:
            return _why(_worker_to_explain(args.where), args.json)
        if args.where is None:
            servers, titles = find.servers()
            if not servers:
                raise ServerNotFound(_list_servers(servers, titles))
            if len(servers) > 1:
                print(_list_servers(servers, titles))
                return 0
            args.where = ("pid", servers[0])
        load = functools.partial(_load, args.where)
        if args.json:
            # Indented for people; one document per line when watching, for tools.
            render = functools.partial(_render_json, indent=None if args.watch else 2)
        else:
            render = format_table
        if args.watch is None:
            print(render(load()))
        else:
            _watch(load, render, args.watch, clear=sys.stdout.isatty() and not args.json)
    except ServerNotFound as exc:
        print(f"forkserve memory: {exc}", file=sys.stderr)
        return 1
    return 0


def _load(where):
    kind, value = where
    if kind == "pidfile":
        return report_from_pid_file(value)
    if kind == "stats":
        return report_from_stats(value)
    return report_from_pid(find.root_of(value, find.titled_processes()))


def _list_servers(servers, titles):
    """The servers running, one line each with its headline, and how to pick one."""
    if not servers:
        return ("no forkserve server is running on this machine (no process is titled "
                "'forkserve: master [APP]' or with another --name); start one, or give its "
                "pid, pid file or --stats address")
    lines = [f"{len(servers)} forkserve servers are running; name one, e.g. "
             f"`forkserve memory {servers[0]}`:"]
    for pid in servers:
        try:
            summary = headline(report_from_pid(pid))
        except ServerNotFound as exc:
            summary = str(exc)
        addresses = [address for address in procfs.listening_addresses(pid)
                     if not address.startswith("unix:@forkserve-why-")]  # --why's own
        where = ", ".join(addresses) or "no listening socket seen"
        lines.append(f"  {pid:>7}  {titles.get(pid, ('?',))[0]} on {where}: {summary}")
    return "\n".join(lines)


def _worker_to_explain(where):
    """The pid of the worker --why explains: the one named, else the serving
    worker with the most private memory of the server named (or the only
    server running)."""
    if where is None:
        servers, titles = find.servers()
        if len(servers) != 1:
            raise ServerNotFound(_list_servers(servers, titles).replace(
                "forkserve memory", "forkserve memory --why"))
        where = ("pid", servers[0])
    if where[0] == "pid":
        title = procfs.parse_title(procfs.read_title(where[1]) or "")
        if title is None or title.role == "worker":
            return where[1]  # copied_objects.ask says what is wrong with a pid that is no worker
    workers = [row for row in _load(where).processes
               if row.info.role == "worker" and row.info.state in (None, "serving")]
    if not workers:
        raise ServerNotFound("the server has no worker to explain (--why explains a worker's "
                             "private memory; a server started with -w 0 has none)")
    return max(workers, key=lambda row: row.memory.private).info.pid


def _why(pid, as_json):
    from forkserve.memory import copied_objects

    def progress(figures):  # one line, rewritten in place, on a terminal only
        sys.stderr.write(f"\rforkserve memory --why: {figures['objects_walked']:,} objects "
                         f"walked, {figures['seconds']:.1f} s\x1b[K")
        sys.stderr.flush()

    # Progress is for a person watching: redirected (2>&1 into a file, a pipe)
    # it would only add lines to the answer.
    watching = sys.stderr.isatty()
    try:
        answer = copied_objects.ask(pid, progress=progress if watching else None)
    except copied_objects.WhyError as exc:
        answer = exc
    if watching:
        sys.stderr.write("\r\x1b[K")  # the progress line goes before the answer
    if isinstance(answer, copied_objects.WhyError):
        print(f"forkserve memory --why: {answer}", file=sys.stderr)
        return 1
    print(json.dumps(answer, indent=2) if as_json else copied_objects.format_why(answer))
    return 0


def _render_json(report, indent):
    return json.dumps(to_json(report), indent=indent)


def _watch(load, render, seconds, clear):
    try:
        while True:
            frame = render(load())
            if clear:
                stamp = time.strftime("%H:%M:%S")
                frame = f"\x1b[H\x1b[2J{stamp}  every {seconds:g}s, Ctrl-C to stop\n\n{frame}"
            print(frame, flush=True)
            time.sleep(seconds)
    except KeyboardInterrupt:  # Ctrl-C is how watching ends
        pass


_COLUMNS_HELP = """\
The server is TARGET: a pid (of its master, a worker or its supervisor), the pid
file it was started with (--pid FILE), or its stats address (--stats HOST:PORT
or unix:PATH). Without TARGET: the one forkserve server running, or a list of
all of them, found by their process titles.

Columns (one row per process; sizes from /proc/PID/smaps_rollup):
  RSS      memory the process has resident, counting every shared page in full
           in each process that maps it; the sum over processes overstates
  PSS      its fair share: each shared page divided among the processes sharing
           it. The sum of PSS is what the server costs the machine
  SHARED   resident memory it shares with at least one other process
  PRIVATE  anonymous memory only this process holds: for a worker, its own
           allocations and the master's pages it copied by writing to them
           (--max-worker-memory limits this)
  FILE     resident file-backed memory (a mapped store, libraries): page cache,
           held once by the machine however many processes map it, and
           reclaimable
  SWAP     memory of the process swapped out
  MINFLT   minor page faults: pages mapped without reading the disk (each
           copy-on-write copy is one)
  MAJFLT   major page faults: pages read from disk (a cold store, swap)
  REQS     requests served (- where not known)
  UPTIME   how long the process has run

The first line under the table is the headline: what the processes use (sum of
PSS, what the machine pays: compare runs by this figure), then its two parts:
one copy of the application (the master's memory, file pages counted once) and
what each worker adds to it. The next line says where the memory is. See
docs/memory.md.
"""


def _parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="forkserve memory",
        usage="forkserve memory [TARGET] [--why [TARGET]] [--json] [--watch SECONDS]",
        description="Show how much memory a forkserve server and its workers use, "
        "and how much of it the workers share.",
        epilog=_COLUMNS_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("target", nargs="?", metavar="TARGET",
                        help="the server: a pid, a pid file or a stats address (see below)")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--pid", metavar="FILE",
                       help="the pid file the server was started with (--pid FILE)")
    where.add_argument("--stats", metavar="ADDRESS",
                       help="the server's stats endpoint (--stats ADDRESS): "
                       "HOST:PORT, http://HOST:PORT or unix:PATH")
    parser.add_argument("--why", metavar="TARGET", nargs="?", const="",
                        help="explain a worker's private memory: which of the master's objects "
                        "it copied, by module-level name and by type. TARGET is the worker's "
                        "pid, or a server (then its worker with the most private memory). With the heap "
                        "shared, what a worker stores in an import-time container is never "
                        "freed: forkserve.keep_mortal() keeps such a container ordinary")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--watch", metavar="SECONDS", type=_positive_seconds,
                        help="refresh every SECONDS until Ctrl-C")
    args = parser.parse_args(argv)
    named = [value for value in (args.target, args.why or None) if value is not None]
    if len(named) + (args.pid is not None) + (args.stats is not None) > 1:
        parser.error("name the server once: TARGET, --why TARGET, --pid FILE or --stats ADDRESS")
    args.where = None
    try:
        if args.pid is not None:
            args.where = ("pidfile", args.pid)
        elif args.stats is not None:
            args.where = ("stats", args.stats)
        elif named:
            args.where = find.classify(named[0])
        if args.where is not None and args.where[0] == "stats":
            parse_stats_address(args.where[1])
    except ValueError as exc:
        parser.error(str(exc))
    return args


def _positive_seconds(text):
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not seconds > 0 or math.isinf(seconds):
        raise argparse.ArgumentTypeError(f"{text!r}: give a positive number of seconds")
    return seconds


def report_from_pid_file(path):
    """Discover and read the server whose master pid is in the file at path."""
    try:
        with open(path) as f:
            text = f.read()
    except FileNotFoundError:
        raise ServerNotFound(
            f"no pid file at {path}: is the server running with --pid {path}?"
        ) from None
    try:
        pid = int(text.strip())
    except ValueError:
        raise ServerNotFound(
            f"{path} does not hold a pid (it starts {text[:20]!r}); give the file the server "
            "was started with --pid FILE"
        ) from None
    return report_from_pid(pid, stale=(
        f"{path} names pid {pid}, which is not running: the server has stopped "
        "(start it again, or remove the stale pid file)"))


def report_from_pid(pid, stale=None):
    """Discover and read the server whose root process is pid."""
    stale = ServerNotFound(stale or f"no process {pid} is running: `forkserve memory` alone "
                                    "lists the forkserve servers that are")
    try:
        report = collect(discover(pid))
    except ProcessLookupError:
        raise stale from None
    except PermissionError as exc:
        raise ServerNotFound(
            f"cannot read {exc.filename}: permission denied; run forkserve memory as the "
            "user the server runs as, or as root"
        ) from None
    if not report.processes:
        raise stale
    return report


def report_from_stats(address, timeout=STATS_TIMEOUT):
    """GET the report the master's stats endpoint serves at address."""
    host, port, socket_path, path = parse_stats_address(address)
    if socket_path is not None:
        conn = _UnixHTTPConnection(socket_path, timeout=timeout)
    else:
        conn = http.client.HTTPConnection(host, port, timeout=timeout)
    check = f"is {address} the server's --stats address?"
    try:
        conn.request("GET", path, headers={"Accept": "application/json"})
        response = conn.getresponse()
        body = response.read()
    except (ConnectionRefusedError, FileNotFoundError):
        raise ServerNotFound(
            f"nothing is listening on {address}: start the server with --stats {address}"
        ) from None
    except PermissionError:
        raise ServerNotFound(
            f"permission denied connecting to {address}: run forkserve memory as the user "
            "the server runs as, or as root"
        ) from None
    except TimeoutError:
        raise ServerNotFound(f"{address} did not answer within {timeout:g} s; {check}") from None
    except (ConnectionResetError, BrokenPipeError, http.client.HTTPException) as exc:
        raise ServerNotFound(
            f"{address} did not answer like a stats endpoint ({exc!r}); {check}"
        ) from None
    finally:
        conn.close()
    if response.status != 200:
        raise ServerNotFound(f"{address} answered {response.status} {response.reason}; {check}")
    try:
        return from_json(json.loads(body))
    except ValueError as exc:  # json.JSONDecodeError is a ValueError
        raise ServerNotFound(f"{address} did not serve a memory report ({exc}); {check}") from None


def parse_stats_address(address):
    """Split a --stats ADDRESS into (host, port, socket_path, request path).

    Accepts HOST:PORT, http://HOST:PORT[/path] and unix:PATH. The stats
    endpoint is unauthenticated, so only loopback hosts are accepted.
    """
    if address.startswith("unix:"):
        socket_path = address[len("unix:") :]
        if not socket_path:
            raise ValueError("unix: needs a socket path, as in unix:/run/forkserve/stats.sock")
        return None, None, socket_path, "/json"
    url = urllib.parse.urlsplit(address if "://" in address else f"http://{address}")
    if url.scheme != "http":
        raise ValueError(f"--stats {address}: only http:// (or unix:PATH) is served")
    try:
        port = url.port
    except ValueError:
        port = None
    if not url.hostname or port is None:
        raise ValueError(f"--stats {address}: give HOST:PORT, as in 127.0.0.1:9100")
    if not _is_loopback(url.hostname):
        raise ValueError(
            f"--stats {address}: the stats endpoint is served on loopback only; "
            "use 127.0.0.1, ::1 or localhost (from the server's machine)"
        )
    return url.hostname, port, None, url.path or "/json"


def _is_loopback(host):
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, socket_path, timeout):
        super().__init__("localhost", timeout=timeout)
        self._socket_path = socket_path

    def connect(self):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self._socket_path)
        except OSError:
            sock.close()
            raise
        self.sock = sock
