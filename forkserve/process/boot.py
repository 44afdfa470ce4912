"""The boot sequence, in the order that keeps memory shared and failures fast.

1. gc.disable() and the exit hook (cow.begin_load), before anything loads.
2. Bind every address (a port in use fails now, not after a long load).
3. gevent.monkey.patch_all() unless --no-monkey-patch, before the app's imports,
   and threading.local made forkserve's C greenlet-local (unless --no-c-local).
4. Import the application: its dataset loads here, once, in the master; then
   every module a worker runs (gevent_servers.preload, _serving_type), so that
   all of them are shared with the heap.
5. --warmup requests (forkserve.process.warmup) and the pre_freeze hook, then
   (unless --no-share-heap, and where it was checked) the heap is made
   immortal but for what finalisers need (forkserve.memory.heap);
   then gc.freeze() + gc.set_threshold(0) (cow.harden), then the post_freeze hook.
6. Write the pid file, then listen() and log the real addresses (as Gunicorn, so
   whoever waits for "Listening at" finds the pid file); then fork workers
   (forkserve.process.master) or serve from this process (forkserve.process.single).

`run()` returns an exit status; it never leaves a socket bound, a pid file
behind or a child running when it returns. The caller ends the process with
cow.exit_process(status).
"""

import logging
import os
import platform
import sys
import traceback

import forkserve
from forkserve.memory import cow
from forkserve import exits, logs
from forkserve.config import ignored, loader
from forkserve.process import (env_settings, generation_protocol, gevent_servers,
                               greenlet_local, privileges, progress, signals, sockets,
                               source_watch, warmup)
from forkserve.http import tls
from forkserve.http.stats import StatsEndpoint
from forkserve.process.hooks import install as install_hooks

__all__ = ["run"]

log = logging.getLogger("forkserve.error")


def run(cfg, app=None, app_name=None, role=None) -> int:
    """Serve `cfg.app` (or an already loaded `app`) with the settings in `cfg`.

    `role` (a generation_protocol.Role) says whether this process is a generation started
    by a reload; by default it is read from the environment, here, once.
    """
    # settings with no effect: given ones, then this run's (before Role takes systemd's variables)
    moot = cfg.warnings + ignored.check(cfg, os.environ, os.getpid())
    role = role or generation_protocol.Role.from_environ()
    if cfg.daemon and not role.supervised and not cfg.check_config:
        from forkserve.process import daemon
        daemon.detach(cfg.enable_stdio_inheritance)
    status = _prepare(cfg)
    if status is not None:
        return status
    # the first line, as Gunicorn's "Starting gunicorn X": what runs, and what it serves
    log.info("Starting forkserve %s serving %s (Python %s)", forkserve.__version__,
             app_name or cfg.app or "an application", platform.python_version())
    hooks = install_hooks(cfg)
    if cfg.share_heap:  # asked for by name: refuse rather than start without it
        from forkserve.memory import heap
        refused = heap.refusal()
        if refused:
            _complain(refused)
            return exits.CONFIG_ERROR
    try:  # the certificate and key are read here, in the master, and again by a reload
        tls.load(cfg, cfg.hooks.get("ssl_context"))
    except tls.TLSError as exc:
        _complain(str(exc))
        return exits.CONFIG_ERROR
    app_name = app_name or cfg.app or "app"
    if cfg.config:  # the one file read, named so a stray ./gunicorn.conf.py is noticed
        log.info("Config file read: %s (%s)", cfg.config, cfg.sources["config"])
    for message in moot:  # what the config asks that forkserve does otherwise, and why
        log.warning("%s", message)
    if cfg.check_config:  # binds nothing: the checked server may be running on the port
        if app is None and _load(cfg) is None:
            return exits.APP_LOAD_ERROR
        return _checked(app_name, moot)
    try:
        hooks.on_starting()
        listeners, stats_listener = _bind(cfg, role)
    except sockets.BindError as exc:
        _complain(str(exc))
        return exits.BIND_ERROR
    except exits.HaltServer as halt:  # on_starting raised (its traceback is logged)
        _complain(halt.reason)
        return halt.status
    pidfile = None
    try:
        if app is None:
            app = _load(cfg)
            if app is None:
                return exits.APP_LOAD_ERROR
        gevent_servers.preload()
        serving = _serving_type(cfg)  # imported before the heap is shared, as the above
        source_watch.install(cfg, role)
        if cfg.warmup:
            warmup.run(app, cfg.warmup)
        hooks.pre_freeze(app)  # a warm-up in Python (forkserve.process.warmup.Client)
        if cfg.share_heap is not False:
            _share_heap(cfg, warmed=bool(cfg.warmup) or hooks.installed("pre_freeze"))
        cow.harden()
        hooks.post_freeze()  # before the hold: what it starts must not inherit blocked signals
        signals.hold()  # until the master or single server has its handlers
        if cfg.pid and not role.supervised:  # the supervisor keeps the pid file
            pidfile = write_pidfile(cfg.pid)  # before "Listening at", which waiters read
        _listen(cfg, listeners, stats_listener)
        stats = StatsEndpoint(stats_listener) if stats_listener is not None else None
        return hooks.on_exit(serving(cfg, app, listeners, app_name, role, stats=stats,
                                     hooks=hooks).run())
    except exits.HaltServer as halt:
        log.error("%s", halt.reason)
        return halt.status
    finally:
        sockets.close_all(listeners + ([stats_listener] if stats_listener else []))
        if pidfile:
            remove_pidfile(pidfile)


def _prepare(cfg):
    """Logging, --chdir, --user/--group checks, the environment: an
    exit status if one fails."""
    try:
        logs.setup(cfg)
    except OSError as exc:
        _complain(str(exc))
        return exits.CONFIG_ERROR
    cow.begin_load()
    try:
        if cfg.chdir:
            os.chdir(cfg.chdir)
        privileges.check(cfg.user, cfg.group)
    except OSError as exc:
        _complain(f"--chdir {cfg.chdir}: {exc.strerror}")
        return exits.CONFIG_ERROR
    except privileges.PrivilegeError as exc:
        _complain(str(exc))
        return exits.CONFIG_ERROR
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    env_settings.apply(cfg)
    return None


def _checked(app_name, moot):
    """--check-config: the exit status once the application has loaded. Settings
    with no effect are warnings (logged above): the server would start."""
    ignored_count = f" ({len(moot)} setting(s) with no effect, see above)" if moot else ""
    print(f"forkserve: configuration OK{ignored_count}; application {app_name} loaded",
          file=sys.stderr)
    return exits.OK


def _bind(cfg, role):
    """The listening sockets (adopted or bound) and the stats one, not yet listening."""
    listeners = generation_protocol.adopted_listeners(role)
    if listeners is None:
        with env_settings.umask(cfg.umask):
            listeners = sockets.bind_all(cfg.bind)
    if not cfg.stats or role.supervised:  # the supervisor serves stats for generations
        return listeners, None
    try:
        stats_listener = sockets.bind(sockets.parse_address(cfg.stats))
    except sockets.BindError:
        sockets.close_all(listeners)
        raise
    stats_listener.set_inheritable(False)
    return listeners, stats_listener


def _load(cfg):
    """Monkey-patch (unless told not to) and import the application, showing
    progress while it loads; None if it fails."""
    if not cfg.no_monkey_patch:
        from gevent import monkey
        monkey.patch_all()
        greenlet_local.install(cfg.c_local)
    try:
        with progress.loading(cfg.app, cfg.load_progress_interval):
            return loader.load(cfg.app)
    except loader.AppLoadError as exc:
        _log_load_error(exc)
        return None


def _share_heap(cfg, warmed):
    """Share the heap (on unless --no-share-heap); say so, or why not."""
    if cfg.workers == 0:
        if cfg.share_heap:
            log.info("--share-heap: skipped, pointless with -w 0 (no worker is forked to "
                     "share the heap with)")
        return
    from forkserve.memory import heap
    off = heap.off_message()
    if off is not None:  # only the default gets here: --share-heap was refused at start
        log.log(*off)
        return
    # A warm-up's cyclic garbage is collected first (heap.share_heap says why).
    report = heap.share_heap(collect_first=warmed)
    large = report.large_mortal()  # what cost sharing most: worth a user's eye
    log.info("Heap sharing: %s%s (--no-share-heap turns it off)", report.headline(),
             f"; {large}" if large else "")
    if report.kept_mortal():  # which finalisers are kept working: a detail, for debugging
        log.debug("Heap sharing: %s", report.kept_mortal())


def _listen(cfg, listeners, stats_listener):
    speaks = sockets.protocols(cfg.bind, cfg.protocol, len(listeners))
    for listener, protocol in zip(listeners, speaks):
        listener.listen(cfg.backlog)
        if tls.context is not None and protocol == "http":
            protocol = "https"  # as Gunicorn says it
        log.info("Listening at: %s (%d)", sockets.describe(listener, protocol), os.getpid())
    if stats_listener is not None:
        stats_listener.listen(16)
        log.info("Stats at: %s (dashboard at /, JSON at /json, Prometheus at /metrics)",
                 sockets.describe(stats_listener))


def _serving_type(cfg):
    """The class that serves: the master, or with -w 0 the single server.

    Imported, with everything it imports, before the heap is shared: a
    module imported after it stays mortal, and every worker copies the pages
    its reference counts are on (about 1 MiB a worker for these)."""
    if cfg.workers == 0:
        from forkserve.process.single import SingleServer
        return SingleServer
    from forkserve.process.master import Master
    return Master


def write_pidfile(path):
    directory = os.path.dirname(os.path.abspath(path))
    temporary = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}")
    try:
        with open(temporary, "w") as handle:
            handle.write(f"{os.getpid()}\n")
        os.replace(temporary, path)
    except OSError as exc:
        raise exits.HaltServer(f"cannot write the pid file {path}: {exc.strerror}; check the "
                               "directory exists and is writable", exits.CONFIG_ERROR) from None
    return path


def remove_pidfile(path):
    try:
        with open(path) as handle:
            if handle.read().strip() != str(os.getpid()):
                return  # another server owns it now
        os.unlink(path)
    except (FileNotFoundError, ValueError):
        pass


def _log_load_error(exc):
    cause = exc.__cause__
    if cause is not None and not isinstance(cause, ModuleNotFoundError):
        log.error("Application traceback:\n%s",
                  "".join(traceback.format_exception(type(cause), cause, cause.__traceback__)))
    _complain(str(exc))


def _complain(message):
    log.error("%s", message)
    if not _logs_to_stderr():
        print(f"forkserve: error: {message}", file=sys.stderr)


def _logs_to_stderr():
    return any(getattr(h, "stream", None) is sys.stderr for h in logs.error_log.handlers)
