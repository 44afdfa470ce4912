"""Serve a Bottle application with forkserve.

    import bottle, forkserve.bottle          # registers server="forkserve"
    bottle.run(app, server="forkserve", host="127.0.0.1", port=8080, workers=4)

or, with any Bottle version, pass the adapter class itself:

    from forkserve.integrations.bottle import ForkserveServer
    bottle.run(app, server=ForkserveServer, workers=4, max_requests=100000)

Keyword arguments are forkserve settings by name (see `forkserve --help`);
`host`/`port` become the bind address unless `bind=[...]` is given. The
calling process is the master: whatever it loaded before bottle.run() is what
the workers share, so load the dataset (and call forkserve.share on it)
first. Call gevent.monkey.patch_all() at the very top of the script if the
application does blocking I/O; forkserve patches late otherwise, and says so.

When the server stops, bottle.run() returns (status 0) or, if the server
could not start, the process exits with forkserve's status and message.

bottle.run(..., reloader=True) works: Bottle runs the server in a child
process and restarts it when that child exits with status 3. In that child
forkserve's master does the watching (--reload) and exits 3 on a change,
and stops when Bottle's parent is gone (Ctrl-C), so no master is left
behind. Bottle's own file-checker thread is ended before the first fork:
under gevent it is a greenlet, which would otherwise run in every worker
(and fail there with a KeyError in threading._delete).
"""

import logging
import os
import signal
import threading
import time

import bottle

from forkserve.memory import cow
from forkserve.process import boot, source_watch
from forkserve.config import settings

__all__ = ["ForkserveServer"]

log = logging.getLogger("forkserve.error")


class ForkserveServer(bottle.ServerAdapter):
    """Bottle's ServerAdapter for forkserve: the caller's process is the master."""

    def run(self, handler):
        options = dict(self.options)
        host = self.host
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
        options.setdefault("bind", [f"{host}:{self.port}"])
        if self.quiet:
            options.setdefault("log_level", "warning")
        unknown = sorted(set(options) - set(settings.BY_NAME))
        if unknown:
            raise TypeError(f"bottle.run(server='forkserve') got unknown forkserve settings "
                            f"{unknown}; see `forkserve --help` for the names")
        try:
            cfg = settings.parse([]).with_values(**options)
        except settings.ConfigError as exc:
            raise ValueError(str(exc)) from None
        if not cfg.no_monkey_patch:
            _patch_late()
        restart = []
        if os.environ.get("BOTTLE_CHILD") == "true":  # bottle.run(..., reloader=True)
            cfg = cfg.with_values(reload=True)
            _take_over_reloading(restart)
        status = boot.run(cfg, app=handler, app_name="bottle")
        if status != 0:
            cow.exit_process(status)
        if restart:
            cow.exit_process(3)  # Bottle's reloader parent starts a fresh child


def _take_over_reloading(restart):
    """In Bottle's reloader child: forkserve's master watches the files instead
    of Bottle's FileCheckerThread, and stops when Bottle's parent is gone."""
    for thread in threading.enumerate():
        if isinstance(thread, bottle.FileCheckerThread):
            thread.status = "exit"  # its loop ends at its next look (within its interval)
            thread.join()
    lockfile = os.environ.get("BOTTLE_LOCKFILE")
    interval = 1.0

    def parent_alive():
        # The parent touches the lock file every `interval`; Bottle's own test.
        try:
            return os.stat(lockfile).st_mtime >= time.time() - interval - 5
        except (FileNotFoundError, TypeError):
            return False

    def changed(path):
        restart.append(path)
        os.kill(os.getpid(), signal.SIGINT)

    source_watch.on_change = changed
    source_watch.wanted = parent_alive if lockfile else None


def _patch_late():
    from gevent import monkey
    if monkey.is_module_patched("socket"):
        return
    log.warning("gevent.monkey.patch_all() was not called before the application was "
                "imported; patching now. Call it at the top of your script so every "
                "import sees cooperative sockets (or pass no_monkey_patch=True).")
    monkey.patch_all()


bottle.server_names.setdefault("forkserve", ForkserveServer)
