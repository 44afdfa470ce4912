"""The `forkserve memory` command: find the server, read it, show it.

The server is found either through its pid file (we read /proc ourselves)
or through its stats endpoint, which serves forkserve.memory.to_json() and
is read back with from_json(). Every failure to find the server ends in a
message saying what to do next, and exit status 1; usage errors exit 2.
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

from forkserve.memory.reporter import collect, discover, format_table, from_json, to_json

#: Seconds to wait for the stats endpoint. It answers from memory, so
#: anything slower means a wrong address or a stuck master.
STATS_TIMEOUT = 2.0


class ServerNotFound(Exception):
    """The server could not be found or read; the message says what to do."""


def main(argv=None):
    """`forkserve memory [--pid FILE | --stats ADDRESS | --why PID] [--json] [--watch SECONDS]`.

    Returns 0 on success, 1 when the server cannot be found or read, 2 on
    a usage error.
    """
    try:
        args = _parse_args(sys.argv[1:] if argv is None else argv)
    except SystemExit as exc:  # argparse printed the usage or --help
        return exc.code
    if args.why is not None:
        return _why(args.why, args.json)
    if args.pid is not None:
        load = functools.partial(report_from_pid_file, args.pid)
    else:
        load = functools.partial(report_from_stats, args.stats)
    if args.json:
        # Indented for people; one document per line when watching, for tools.
        render = functools.partial(_render_json, indent=None if args.watch else 2)
    else:
        render = format_table
    try:
        if args.watch is None:
            print(render(load()))
        else:
            _watch(load, render, args.watch, clear=sys.stdout.isatty() and not args.json)
    except ServerNotFound as exc:
        print(f"forkserve memory: {exc}", file=sys.stderr)
        return 1
    return 0


def _why(pid, as_json):
    from forkserve.memory import why

    try:
        answer = why.ask(pid)
    except why.WhyError as exc:
        print(f"forkserve memory --why: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(answer, indent=2) if as_json else why.format_why(answer))
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


def _parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="forkserve memory",
        description="Show how much memory a forkserve server and its workers use, "
        "and how much of it the workers share.",
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--pid", metavar="FILE",
                       help="the pid file the server was started with (--pid FILE)")
    where.add_argument("--stats", metavar="ADDRESS",
                       help="the server's stats endpoint (--stats ADDRESS): "
                       "HOST:PORT, http://HOST:PORT or unix:PATH")
    where.add_argument("--why", metavar="PID", type=int,
                       help="explain a worker's private memory: which of the master's objects "
                       "it copied, by module-level name and by type")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--watch", metavar="SECONDS", type=_positive_seconds,
                        help="refresh every SECONDS until Ctrl-C")
    args = parser.parse_args(argv)
    if args.pid is None and args.stats is None and args.why is None:
        parser.error(
            "say where the server is: --pid FILE (the pid file it was started with) "
            "or --stats ADDRESS (its stats endpoint), or --why PID (a worker)"
        )
    if args.stats is not None:
        try:
            parse_stats_address(args.stats)
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
    stale = ServerNotFound(
        f"{path} names pid {pid}, which is not running: the server has stopped "
        "(start it again, or remove the stale pid file)"
    )
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
