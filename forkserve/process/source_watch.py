"""--reload, for development: restart when a source file changes; and
--touch-reload (uWSGI's touch-reload): restart when one named file does.

After the application is loaded, the master notes the modification time of
every file behind sys.modules (and of --reload-extra-file files). Its loop
calls `poll()`, which looks again at most every `interval` seconds; on a
change it logs the file and asks for a reload: SIGHUP to the process that
reloads (the master, or the supervisor once a reload has happened), which
starts a new generation with the current code and data and drains the old
one (forkserve.process.generation_protocol). A file that fails to import leaves the old
generation serving and its traceback in the log; save a fix and it reloads.

This is a development tool: a check costs one stat() per loaded module
every second, and every change reloads the whole dataset.

`SourceWatcher` only decides (files and mtimes in, a changed path out);
`poll()` does the signalling.
"""

import logging
import os
import signal
import sys
import time


__all__ = ["SourceWatcher", "source_files", "install", "poll"]

log = logging.getLogger("forkserve.error")


def source_files(modules=None, extra=()):
    """The .py files behind the loaded modules, plus `extra`."""
    files = set()
    for module in list((modules if modules is not None else sys.modules).values()):
        path = getattr(module, "__file__", None)
        if not path:
            continue
        if path.endswith((".pyc", ".pyo")):
            path = path[:-1]
        files.add(os.path.abspath(path))
    files.update(os.path.abspath(path) for path in extra)
    return files


def _mtime(path):
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None  # gone (or unreadable): a change if it existed before


class SourceWatcher:
    def __init__(self, files, interval=1.0, clock=time.monotonic, mtime=_mtime):
        self.interval = interval
        self.clock = clock
        self.mtime = mtime
        self.times = {path: mtime(path) for path in files}
        self.next_check = clock() + interval

    def changed(self):
        """A path whose mtime changed since the last look (then re-armed), or None."""
        now = self.clock()
        if now < self.next_check:
            return None
        self.next_check = now + self.interval
        for path, seen in self.times.items():
            current = self.mtime(path)
            if current != seen:
                self.times[path] = current
                return path
        return None


_watcher = None
#: the --touch-reload files (a change to one is logged as such)
_touched = frozenset()
#: True in a generation a reload started: its parent (the supervisor) reloads
_supervised = False
#: what a change does: f(path). Default: SIGHUP to the process that reloads.
on_change = None
#: whether whoever started this server still wants it (bottle's reloader
#: parent): a callable, or None. When it says no, the server stops (INT).
wanted = None


def install(cfg, role):
    """Start watching, if --reload is on. Called once the application is loaded;
    `role` (forkserve.process.generation_protocol.Role) says who does the reloading."""
    global _watcher, _supervised, _touched
    _touched = touched = {os.path.abspath(path) for path in cfg.touch_reload}
    if not cfg.reload and not touched:
        return
    _supervised = role.supervised
    files = source_files(extra=cfg.reload_extra_files) if cfg.reload else set()
    _watcher = SourceWatcher(files.union(touched))
    if cfg.reload:
        log.warning("--reload is a development tool: watching %d files; a change reloads the "
                    "application and its data", len(_watcher.times))
    else:
        log.info("--touch-reload: a change to %s reloads the application gracefully",
                 ", ".join(sorted(touched)))


def poll():
    """From the master's (or single process's) loop: act on a changed file."""
    if _watcher is None:
        return
    global wanted
    if wanted is not None and not wanted():
        wanted = None  # once: the stop is under way
        log.info("the process that started this server is gone: stopping")
        os.kill(os.getpid(), signal.SIGINT)
        return
    path = _watcher.changed()
    if path is None:
        return
    log.info("%s changed: reloading (%s)", path,
             "--touch-reload" if path in _touched else "--reload")
    (on_change or _hang_up)(path)


def _hang_up(path):
    # A generation's parent is the supervisor, which does the reloading.
    target = os.getppid() if _supervised else os.getpid()
    os.kill(target, signal.SIGHUP)
