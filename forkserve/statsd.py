"""Gunicorn's statsd metrics (statsd_host, statsd_prefix, dogstatsd_tags).

Datadog's and others' Gunicorn integrations read these names, so they are
Gunicorn's, with Gunicorn's types and datagram format:

  gunicorn.requests                counter  one per request ("NAME:1|c|@1.0")
  gunicorn.request.duration        timer    its milliseconds ("NAME:12.5|ms")
  gunicorn.request.status.<code>   counter  one per request, by status
  gunicorn.workers                 gauge    the master's worker count, when it changes
  gunicorn.log.<level>             counter  critical, error, warning, exception:
                                            one per server log line at that level

statsd_prefix goes before every name, with one dot after it (Gunicorn's
rule: "app" and "app." both give "app.gunicorn.requests"); dogstatsd_tags
are appended as "|#tags".

Invariants: a datagram is sent with one send(2) on a non-blocking UDP (or
unix datagram) socket, connected once in the master and inherited by the
workers, so a request never waits for it: a send the kernel does not take
at once, or that fails (no listener: ECONNREFUSED), is counted in `failed`
and dropped, never logged per datagram (a log line per failed send would
be one more send per request, and a flood). One line is logged for the
first failure, so a wrong address is noticed.
"""

import logging
import re
import socket

__all__ = ["Statsd", "parse_address", "client", "setup", "request", "workers"]

log = logging.getLogger("forkserve.error")

#: statsd's port when statsd_host names none (Gunicorn's default too)
DEFAULT_PORT = 8125


def parse_address(value):
    """statsd_host as Gunicorn reads it: HOST:PORT (PORT 8125 if left out),
    [IPV6]:PORT, or unix://PATH (unix:PATH) for a unix datagram socket:
    (family, address)."""
    text = str(value).strip()
    match = re.match(r"unix:(//)?(.+)$", text)
    if match and not match.group(2).isdigit():  # unix:8125 is a host named unix
        return socket.AF_UNIX, match.group(2)
    if text.startswith("["):
        host, _, port = text[1:].partition("]")
        port = port.lstrip(":")
        family = socket.AF_INET6
    else:
        host, _, port = text.partition(":")
        family = socket.AF_INET
    if not host:
        raise ValueError(f"expected HOST:PORT or unix://PATH, got {value!r}")
    try:
        number = int(port) if port else DEFAULT_PORT
    except ValueError:
        raise ValueError(f"{port!r} is not a port number in statsd_host {value!r}; give "
                         "HOST:PORT or unix://PATH") from None
    if not 0 < number < 65536:
        raise ValueError(f"port {number} out of range in statsd_host {value!r}")
    return family, (host.lower(), number)


def _prefix(prefix):
    """Gunicorn's rule: a non-empty prefix ends with exactly one dot."""
    prefix = (prefix or "").rstrip(".")
    return prefix + "." if prefix else ""


class Statsd:
    """One statsd client: `counter`, `timer`, `gauge` each send one datagram."""

    def __init__(self, address, prefix="", tags=""):
        family, target = address if isinstance(address, tuple) and isinstance(
            address[0], socket.AddressFamily) else parse_address(address)
        self.prefix = _prefix(prefix)
        self.suffix = ("|#" + tags).encode("ascii") if tags else b""
        #: datagrams not sent (the kernel did not take them, or nobody listens)
        self.failed = 0
        self._told = False
        self.sock = socket.socket(family, socket.SOCK_DGRAM)
        self.sock.setblocking(False)
        try:
            self.sock.connect(target)
        except OSError as exc:  # an unknown host, a missing unix socket: counted as sends fail
            log.warning("statsd_host %s: %s; metrics are dropped until it answers",
                        _shown(target), exc.strerror or exc)

    def send(self, metric):
        """Send one metric line ("NAME:VALUE|TYPE"), prefixed and tagged."""
        try:
            self.sock.send((self.prefix + metric).encode("ascii") + self.suffix)
        except OSError as exc:  # EAGAIN, ECONNREFUSED, ENOTCONN...: all mean dropped
            self.failed += 1
            if not self._told:
                self._told = True
                log.warning("statsd: a metric could not be sent (%s); further failures are "
                            "counted, not logged", exc.strerror or exc)

    def counter(self, name, value=1):
        self.send(f"{name}:{value}|c|@1.0")

    def timer(self, name, milliseconds):
        self.send(f"{name}:{milliseconds}|ms")

    def gauge(self, name, value):
        self.send(f"{name}:{value}|g")

    def request(self, status, seconds):
        """The three metrics of one request, as Gunicorn sends them."""
        self.timer("gunicorn.request.duration", round(seconds * 1000.0, 3))
        self.counter("gunicorn.requests")
        if status:  # None: the application gave no response (the client left)
            self.counter(f"gunicorn.request.status.{status}")

    def close(self):
        self.sock.close()


def _shown(target):
    return target if isinstance(target, str) else f"{target[0]}:{target[1]}"


class LogCounter(logging.Handler):
    """Counts the server log's warning and worse lines as gunicorn.log.<level>
    (an ERROR with a traceback as gunicorn.log.exception, as Gunicorn's
    log.exception())."""

    def __init__(self, statsd):
        super().__init__(logging.WARNING)
        self.statsd = statsd

    def emit(self, record):
        if record.levelno >= logging.CRITICAL:
            level = "critical"
        elif record.levelno >= logging.ERROR:
            level = "exception" if record.exc_info else "error"
        else:
            level = "warning"
        self.statsd.counter(f"gunicorn.log.{level}")


#: this process's client (made by setup() in the master, inherited by workers), or None
client = None
_workers_sent = None


def setup(cfg, error_log):
    """Make the process's client from statsd_host (None without one) and
    count `error_log`'s lines."""
    global client, _workers_sent
    for handler in [h for h in error_log.handlers if isinstance(h, LogCounter)]:
        error_log.removeHandler(handler)
    if client is not None:
        client.close()
    client, _workers_sent = None, None
    if cfg.statsd_host:
        client = Statsd(cfg.statsd_host, cfg.statsd_prefix, cfg.dogstatsd_tags)
        error_log.addHandler(LogCounter(client))
    return client


def request(status, seconds):
    """Count one request (no-op without statsd_host)."""
    if client is not None:
        client.request(status, seconds)


def workers(count):
    """The master's worker count: a gauge each time it changes (as Gunicorn)."""
    global _workers_sent
    if client is not None and count != _workers_sent:
        _workers_sent = count
        client.gauge("gunicorn.workers", count)
