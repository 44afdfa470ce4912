"""Logging setup: the server log ("forkserve.error") and the access log
("forkserve.access"), each to stderr/stdout or a file that USR1 reopens.

Gunicorn's logconfig, logconfig_dict and logconfig_json hand the setup to
logging.config; what they say about "gunicorn.error" and "gunicorn.access"
applies to forkserve's two loggers. capture_output sends the process's
stdout and stderr (descriptors 1 and 2) to the error log file. syslog = True
also sends both logs to syslog as Gunicorn does (`_add_syslog`), and
statsd_host counts the server log's warnings and errors (forkserve.statsd).
"""

import atexit
import errno
import json
import logging
import logging.config
import logging.handlers
import os
import socket
import sys
import time

from forkserve.http.accesslog import capture

__all__ = ["setup", "reopen", "error_log", "access_log", "access_enabled", "access_sink",
           "AccessFileHandler", "parse_syslog_address"]

error_log = logging.getLogger("forkserve.error")
access_log = logging.getLogger("forkserve.access")

#: write errors after which the access log drops lines and tries again later
_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})

_FORMAT = "[%(asctime)s] [%(process)d] [%(levelname)s] %(message)s"


class _Formatter(logging.Formatter):
    converter = time.localtime

    def formatTime(self, record, datefmt=None):
        return time.strftime("%Y-%m-%d %H:%M:%S %z", self.converter(record.created))


def _handler(target, stream, file_class=logging.FileHandler):
    if target in (None, "-"):
        return logging.StreamHandler(stream)
    directory = os.path.dirname(os.path.abspath(target))
    if not os.path.isdir(directory):
        raise OSError(f"log file directory {directory} does not exist; create it or "
                      "choose another path")
    return file_class(target, encoding="utf-8", delay=False)


class AccessFileHandler(logging.FileHandler):
    """The access log file, written in blocks: entries wait in a list and
    reach the file in one write() at most `flush_interval` seconds after
    their request (or once `max_pending` entries wait, or at exit:
    logging.shutdown and an atexit hook flush), instead of one write() per
    request.

    An entry is a line, or what accesslog.capture() took from a request,
    which `render` turns into the line when the block is written: less work
    per request than formatting each line amid its request's work (1.7 us
    against 2.6 us measured in a worker; benchmarks/README.md). A block is
    whole lines written with one write() on a file opened for appending, so
    workers logging to the same file never split each other's lines. The
    timer runs on the worker's gevent loop.

    A full disk (or quota) does not stop the server, and does not stop the
    log for good: a block that cannot be written is dropped and counted
    (`dropped`), one warning per `warn_interval` goes to the server log,
    and lines are written again from the first write that succeeds. The
    file is unbuffered, so nothing failed stays in a buffer to come back
    later, out of time, once space is freed."""

    #: seconds an entry may wait; one write per interval under load
    flush_interval = 0.5
    #: entries that may wait before they are written at once
    max_pending = 4096
    #: turns the list of entries into their lines (AccessFormat.render_all)
    render = None
    _flush_timer = None
    #: seconds between two warnings about dropped lines, however many fail
    warn_interval = 10.0

    def __init__(self, *args, **kwargs):
        self._pending = []
        #: lines dropped because the file could not take them, in all
        self.dropped = 0
        self._unreported = 0  # dropped since the last warning
        self._failing = False
        self._torn = False  # the file ends in part of a line a short write left
        self._next_warning = 0.0
        super().__init__(*args, **kwargs)
        # Not only logging.shutdown: an application that calls dictConfig
        # (Django does, at setup) closes every handler and drops it from
        # logging's list, and this one reopens on the next line.
        atexit.register(self.flush)

    def emit(self, record):
        self.add(self.format(record))

    def add(self, entry):
        """Queue one line (str) or one captured request (for `render`)."""
        pending = self._pending
        pending.append(entry)
        if len(pending) >= self.max_pending or self._flush_timer is None:
            self.added()

    def added(self):
        """After entries were appended to `_pending`: write them if enough
        wait, else make sure the timer will."""
        if len(self._pending) >= self.max_pending:
            self.flush()
        elif self._flush_timer is None:
            from gevent import get_hub
            self._flush_timer = get_hub().loop.timer(self.flush_interval)
            self._flush_timer.start(self.flush)

    def flush(self):
        timer, self._flush_timer = self._flush_timer, None
        if timer is not None:
            timer.close()
        pending = self._pending
        if pending:
            entries = pending[:]
            pending.clear()  # the same list: access_sink appends to it directly
            lines = entries if self.render is None else self.render(entries)
            lines.append("")
            self._write("\n".join(lines).encode("utf-8", "backslashreplace"))
        super().flush()

    def _open(self):
        # Unbuffered bytes: a write either reaches the file or fails now.
        return open(self.baseFilename, "ab", buffering=0)

    def _write(self, block):
        if self._torn:  # end the piece of line a short write left
            block = b"\n" + block
        written = 0
        try:
            if self.stream is None:  # closed by a logging (re)configuration: reopen
                self.stream = self._open()
            while written < len(block):  # a short write: the rest, or the error that stopped it
                written += self.stream.write(block[written:])
        except OSError as exc:
            if exc.errno not in _FULL_ERRNOS:
                raise
            self._torn = written > 0 and block[written - 1] != 0x0A
            self._drop(block.count(b"\n", written), exc)
            return
        self._torn = False
        if self._failing:
            self._failing = False
            error_log.warning("access log %s: writing again (%d lines dropped in all while "
                              "it could not be written)", self.baseFilename, self.dropped)
            self._unreported = 0

    def _drop(self, lines, exc):
        self.dropped += lines
        self._unreported += lines
        self._failing = True
        now = time.monotonic()
        if now < self._next_warning:
            return
        self._next_warning = now + self.warn_interval
        error_log.warning("access log %s: %s; dropped %d lines (%d in all); lines are written "
                          "again as soon as the file takes them: free space on its filesystem "
                          "or move the log (--access-logfile)", self.baseFilename,
                          exc.strerror, self._unreported, self.dropped)
        self._unreported = 0


def access_sink(access_format):
    """What logs one request (see http.server.Server.access_sink): straight
    into forkserve's own file handler when it is all the access logger has,
    captured now and rendered when written if the format allows
    (AccessFormat.deferrable); else formatted now and passed through logging
    (a logging config's handlers and filters). Either way nothing is written
    while the logger is disabled or set above INFO (as Gunicorn's access
    log, for a logging config that disables it): the captured entries are
    dropped when written."""
    handlers = access_log.handlers
    line = access_format.line

    def now_line(environ, request_line, status, response_headers, sent, started):
        return line(environ, request_line, status, response_headers, sent,
                    time.perf_counter() - started)

    def enabled():
        return access_log.isEnabledFor(logging.INFO)

    if not (len(handlers) == 1 and type(handlers[0]) is AccessFileHandler
            and not access_log.filters and not handlers[0].filters):
        return lambda *facts: enabled() and access_log.info("%s", now_line(*facts))
    handler = handlers[0]
    if not access_format.deferrable:
        add = handler.add
        return lambda *facts: enabled() and add(now_line(*facts))
    append, full = handler._pending.append, handler.max_pending
    render_all = access_format.render_all
    handler.render = lambda entries: render_all(entries) if enabled() else []

    def capture_request(environ, request_line, status, response_headers, sent, started):
        # handler.add(capture(...)), two calls less per request
        append(capture(environ, request_line, status, sent))
        if handler._flush_timer is None or len(handler._pending) >= full:
            handler.added()
    return capture_request


def setup(cfg):
    """Configure both loggers from settings. Safe to call again (replaces handlers)."""
    level = getattr(logging, cfg.log_level.upper())
    _install(error_log, _handler(cfg.error_logfile, sys.stderr), level, _Formatter(_FORMAT))
    if cfg.access_logfile:
        _install(access_log, _handler(cfg.access_logfile, sys.stdout, AccessFileHandler),
                 logging.INFO, logging.Formatter("%(message)s"))
    else:
        for handler in list(access_log.handlers):
            access_log.removeHandler(handler)
        access_log.disabled = not _access_to_syslog(cfg)
        access_log.setLevel(logging.INFO)
        access_log.propagate = False
    # The store and other forkserve modules log under "forkserve".
    parent = logging.getLogger("forkserve")
    parent.setLevel(level)
    if not parent.handlers:
        parent.addHandler(_ProxyToError())
        parent.propagate = False
    _configure(cfg)
    if cfg.syslog:
        _add_syslog(cfg)
    from forkserve import statsd
    statsd.setup(cfg, error_log)
    _capture_output(cfg)


def parse_syslog_address(address):
    """syslog_addr as Gunicorn reads it: (socket type or None, address for
    SysLogHandler). unix://PATH tries a datagram then a stream socket
    (None) unless #dgram or #stream says which; udp:// and tcp:// take
    HOST:PORT, [IPV6]:PORT or HOST (port 514)."""
    scheme, found, rest = address.partition("://")
    if not found or scheme not in ("unix", "udp", "tcp"):
        raise ValueError(f"expected udp://HOST:PORT, tcp://HOST:PORT or unix://PATH, "
                         f"got {address!r}")
    if scheme == "unix":
        path, _, kind = rest.partition("#")
        if not path or kind not in ("", "dgram", "stream"):
            raise ValueError(f"expected unix://PATH, unix://PATH#dgram or unix://PATH#stream, "
                             f"got {address!r}")
        return {"dgram": socket.SOCK_DGRAM, "stream": socket.SOCK_STREAM}.get(kind), path
    if rest.startswith("["):
        host, _, port = rest[1:].partition("]")
        port = port.lstrip(":")
    else:
        host, _, port = rest.partition(":")
    try:
        number = int(port) if port else logging.handlers.SYSLOG_UDP_PORT
    except ValueError:
        raise ValueError(f"{port!r} is not a port number in {address!r}") from None
    kind = socket.SOCK_DGRAM if scheme == "udp" else socket.SOCK_STREAM
    return kind, (host.lower() or "localhost", number)


def _add_syslog(cfg):
    """A SysLogHandler on each log, as Gunicorn's: the tag
    'gunicorn.PREFIX.error' or '.access' (PREFIX: syslog_prefix, else the
    process name or the application, ':' as '.'), then '[pid] message'."""
    kind, address = parse_syslog_address(cfg.syslog_addr)
    facility = logging.handlers.SysLogHandler.facility_names[cfg.syslog_facility]
    prefix = cfg.syslog_prefix or (cfg.name or cfg.app or "forkserve").replace(":", ".")
    loggers = ((error_log, "error"), (access_log, "access"))
    for logger, name in loggers if _access_to_syslog(cfg) else loggers[:1]:
        for old in [h for h in logger.handlers if isinstance(h, logging.handlers.SysLogHandler)]:
            logger.removeHandler(old)
            old.close()
        try:
            handler = logging.handlers.SysLogHandler(address, facility, kind)
        except OSError as exc:
            raise OSError(f"syslog_addr {cfg.syslog_addr}: {exc.strerror or exc}; check that "
                          "syslog listens there, or set syslog_addr") from None
        handler.setFormatter(logging.Formatter(f"gunicorn.{prefix}.{name}: [%(process)d] "
                                               "%(message)s"))
        logger.addHandler(handler)


def access_enabled(cfg) -> bool:
    """Whether requests are logged: an access log file, or a logging config (as Gunicorn)."""
    return bool(cfg.access_logfile or cfg.logconfig or cfg.logconfig_dict
                or cfg.logconfig_json or _access_to_syslog(cfg))


def _access_to_syslog(cfg) -> bool:
    return cfg.syslog and not cfg.disable_redirect_access_to_syslog


#: Gunicorn's logging.config defaults, which a logconfig_dict is laid over
_GUNICORN_DICT = {
    "version": 1,
    "disable_existing_loggers": False,
    "root": {"level": "INFO", "handlers": ["console"]},
    "loggers": {
        "gunicorn.error": {"level": "INFO", "handlers": ["error_console"], "propagate": True},
        "gunicorn.access": {"level": "INFO", "handlers": ["console"], "propagate": True},
    },
    "handlers": {
        "console": {"class": "logging.StreamHandler", "formatter": "generic",
                    "stream": "ext://sys.stdout"},
        "error_console": {"class": "logging.StreamHandler", "formatter": "generic",
                          "stream": "ext://sys.stderr"},
    },
    "formatters": {
        "generic": {"format": "%(asctime)s [%(process)d] [%(levelname)s] %(message)s",
                    "datefmt": "[%Y-%m-%d %H:%M:%S %z]", "class": "logging.Formatter"},
    },
}


def _configure(cfg):
    if not (cfg.logconfig or cfg.logconfig_dict or cfg.logconfig_json):
        return
    try:
        if cfg.logconfig_dict or cfg.logconfig_json:
            config = dict(_GUNICORN_DICT)
            if cfg.logconfig_json:
                with open(cfg.logconfig_json, encoding="utf-8") as handle:
                    config.update(json.load(handle))
            config.update(cfg.logconfig_dict or {})
            logging.config.dictConfig(config)
        if cfg.logconfig:
            if not os.path.isfile(cfg.logconfig):
                raise OSError(f"--log-config {cfg.logconfig}: no such file")
            logging.config.fileConfig(cfg.logconfig, defaults={"__file__": cfg.logconfig,
                                                               "here": os.path.dirname(
                                                                   cfg.logconfig)},
                                      disable_existing_loggers=False)
    except (ValueError, TypeError, KeyError, ImportError, AttributeError) as exc:
        raise OSError(f"the logging configuration failed: {type(exc).__name__}: {exc}; "
                      "check logconfig / logconfig_dict / logconfig_json") from None
    for ours, theirs in ((error_log, "gunicorn.error"), (access_log, "gunicorn.access")):
        configured = logging.getLogger(theirs)
        if configured.handlers or theirs in (cfg.logconfig_dict or {}).get("loggers", {}):
            for handler in list(ours.handlers):
                ours.removeHandler(handler)
            for handler in configured.handlers:
                ours.addHandler(handler)
            ours.setLevel(configured.level or logging.INFO)
            ours.propagate = configured.propagate
            ours.disabled = False


def _capture_output(cfg):
    if not cfg.capture_output or cfg.error_logfile in (None, "-"):
        return
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(cfg.error_logfile, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


class _ProxyToError(logging.Handler):
    """Send records of other forkserve loggers to the server log's handlers."""

    def emit(self, record):
        if record.name.startswith("forkserve.error") or record.name.startswith("forkserve.access"):
            return
        for handler in error_log.handlers:
            if record.levelno >= handler.level:
                handler.handle(record)


def _install(logger, handler, level, formatter):
    for old in list(logger.handlers):
        logger.removeHandler(old)
        old.close()
    handler.setFormatter(formatter)
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False
    logger.disabled = False


def reopen(cfg=None):
    """Reopen file handlers (after logrotate moved the files)."""
    if cfg is not None:
        _capture_output(cfg)
    for logger in (error_log, access_log):
        for handler in logger.handlers:
            if isinstance(handler, logging.FileHandler):
                handler.acquire()
                try:
                    handler.close()
                    handler.stream = handler._open()
                finally:
                    handler.release()
