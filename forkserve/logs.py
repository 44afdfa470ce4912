"""Logging setup: the server log ("forkserve.error") and the access log
("forkserve.access"), each to stderr/stdout or a file that USR1 reopens."""

import logging
import os
import sys
import time

__all__ = ["setup", "reopen", "error_log", "access_log"]

error_log = logging.getLogger("forkserve.error")
access_log = logging.getLogger("forkserve.access")

_FORMAT = "[%(asctime)s] [%(process)d] [%(levelname)s] %(message)s"


class _Formatter(logging.Formatter):
    converter = time.localtime

    def formatTime(self, record, datefmt=None):
        return time.strftime("%Y-%m-%d %H:%M:%S %z", self.converter(record.created))


def _handler(target, stream):
    if target in (None, "-"):
        return logging.StreamHandler(stream)
    directory = os.path.dirname(os.path.abspath(target))
    if not os.path.isdir(directory):
        raise OSError(f"log file directory {directory} does not exist; create it or "
                      "choose another path")
    return logging.FileHandler(target, encoding="utf-8", delay=False)


def setup(cfg):
    """Configure both loggers from settings. Safe to call again (replaces handlers)."""
    level = getattr(logging, cfg.log_level.upper())
    _install(error_log, _handler(cfg.error_logfile, sys.stderr), level, _Formatter(_FORMAT))
    if cfg.access_logfile:
        _install(access_log, _handler(cfg.access_logfile, sys.stdout), logging.INFO,
                 logging.Formatter("%(message)s"))
    else:
        for handler in list(access_log.handlers):
            access_log.removeHandler(handler)
        access_log.disabled = True
    # The store and other forkserve modules log under "forkserve".
    parent = logging.getLogger("forkserve")
    parent.setLevel(level)
    if not parent.handlers:
        parent.addHandler(_ProxyToError())
        parent.propagate = False


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


def reopen():
    """Reopen file handlers (after logrotate moved the files)."""
    for logger in (error_log, access_log):
        for handler in logger.handlers:
            if isinstance(handler, logging.FileHandler):
                handler.acquire()
                try:
                    handler.close()
                    handler.stream = handler._open()
                finally:
                    handler.release()
