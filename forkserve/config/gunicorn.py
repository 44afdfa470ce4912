"""What forkserve does with every Gunicorn setting, declared once.

A Gunicorn user switches by changing one word, so a Gunicorn config file
(`-c gunicorn.conf.py`) and Gunicorn's command-line flags must work as they
are, and nothing a user sets may be silently ignored. Each of Gunicorn's
settings (all of gunicorn.config.KNOWN_SETTINGS, 27.0) has one `Row` here:

  honoured  forkserve does what Gunicorn does, under the forkserve setting
            `target` (the same name, or forkserve's older name for it);
  hook      a server hook with Gunicorn's name and arguments
            (forkserve.process.hooks calls it);
  ignored   the setting has no effect under forkserve (it tunes a part
            forkserve does not have, or Gunicorn itself ignores it beside the
            gevent worker): the server starts and logs a warning that says why;
  refused   a behaviour a user relies on and forkserve cannot give (TLS,
            an ASGI worker, lenient parsing...): the server does
            not start, and the error says why and what to use instead. Values
            in `warned` only warn, with `warning` as the reason.

A value in `harmless` (Gunicorn's default, or what forkserve always does)
asks for nothing forkserve does differently: no warning, no error.

The rule between the two: a setting whose absence changes only speed, a
file's place or a debugging aid is ignored with a warning; one whose absence
loses data (logs, metrics), breaks clients (HTTP/2 cleartext, lenient
parsing) or the way the server is run (reuse_port's second instance) is
refused.

This module only decides: `settings_from_file` turns a config file's names
into forkserve settings and hooks, `translate` checks one Gunicorn value,
`table` renders docs/gunicorn.md's table. Config files are read by
forkserve.config.settings; problems are collected in a
forkserve.config.values.Findings so that one run reports them all.
"""

import argparse
import dataclasses
import difflib
import inspect
import textwrap
import types

from forkserve.config.values import one_of

__all__ = ["Row", "ROWS", "BY_NAME", "HOOKS", "FORKSERVE_HOOKS", "translate",
           "settings_from_file", "add_arguments", "table", "DEST_PREFIX"]

#: argparse destinations of Gunicorn's flags are "gunicorn:NAME"; translate() maps them
DEST_PREFIX = "gunicorn:"


@dataclasses.dataclass(frozen=True)
class Row:
    name: str
    kind: str                    # "honoured", "hook", "ignored" or "refused"
    note: str
    target: str | None = None    # the forkserve setting a honoured row sets
    flags: tuple = ()            # Gunicorn's flags forkserve accepts for this row
    switch: bool = False         # a flag that takes no value (store_true)
    harmless: tuple = ()         # values of an ignored or refused row that change nothing
    warned: tuple = ()           # values of a refused row that only warn ...
    warning: str = ""            # ... saying this


def _honoured(name, note="", target=None, flags=(), switch=False):
    return Row(name, "honoured", note or "Same meaning.", target or name, flags, switch)


def _refused(name, why, flags=(), switch=False, harmless=(), warned=(), warning=""):
    return Row(name, "refused", why, None, flags, switch, harmless, warned, warning)


def _ignored(name, why, flags=(), switch=False, harmless=()):
    return Row(name, "ignored", why, None, flags, switch, harmless)


_HTTP2 = "forkserve speaks HTTP/1.1; let the proxy in front speak HTTP/2 to clients."
_ASGI = "forkserve serves WSGI applications only; run ASGI apps under an ASGI server."
_DIRTY = ("Gunicorn's dirty arbiters are not part of forkserve; run long jobs in a separate "
          "process or queue.")
_CONTROL = "forkserve is controlled by signals (HUP, TERM, TTIN, USR1...) and --stats."
_ONLY_H1 = ("forkserve speaks HTTP/1.1 and serves every client HTTP/1.1, as Gunicorn does "
            "without TLS or http2_cleartext.")
_ONLY_ASGI = "Gunicorn uses it only with an ASGI worker; forkserve serves WSGI."
_ONLY_DIRTY = "Gunicorn uses it only with dirty_apps, which forkserve does not have."
_ONLY_STATSD = ("Gunicorn sends it only with statsd_host: its gunicorn.backlog histogram, "
                "which forkserve does not send.")
#: worker_class values that run the same WSGI application in gevent as forkserve does
_GEVENT_WORKERS = ("gevent", "gevent_wsgi", "gevent_pywsgi",
                   "gunicorn.workers.ggevent.GeventWorker",
                   "gunicorn.workers.ggevent.GeventPyWSGIWorker")
#: worker_class values that run a WSGI application one request per process or thread
_WSGI_WORKERS = ("sync", "gthread", "gunicorn.workers.sync.SyncWorker",
                 "gunicorn.workers.gthread.ThreadWorker")
_STRICT = ("forkserve's parser follows RFC 9112 strictly and has no switch to relax it; "
           "fix the client or the proxy instead.")

#: Gunicorn's server hooks and the number of arguments each takes.
HOOKS = {
    "on_starting": 1, "on_reload": 1, "when_ready": 1, "pre_fork": 2, "post_fork": 2,
    "post_worker_init": 1, "worker_int": 1, "worker_abort": 1, "pre_exec": 1,
    "pre_request": 2, "post_request": 4, "child_exit": 2, "worker_exit": 2,
    "nworkers_changed": 3, "on_exit": 1, "ssl_context": 2,
}

#: forkserve's own hooks, for moments Gunicorn does not have (see docs/gunicorn.md).
FORKSERVE_HOOKS = {
    "pre_freeze": 2,    # (server, app): the application is loaded; warm it up before freezing
    "post_freeze": 1,   # (server): the dataset is loaded and frozen, before the first fork
    "pre_retire": 2,    # (server, generation): a reload's new generation serves; this one drains
}

_HOOK_NOTES = {
    "on_starting": "Called in the master before the sockets are bound.",
    "on_reload": "Called in the master on HUP, before the new generation starts.",
    "when_ready": "Called in the master once it serves, before the workers are forked.",
    "pre_fork": "Called in the master before each worker is forked.",
    "post_fork": "Called in the worker right after fork.",
    "post_worker_init": "Called in the worker once it is set up, before it accepts.",
    "worker_int": "Called in the worker on INT or QUIT.",
    "worker_abort": "Called in a worker the master killed for --timeout (SIGABRT).",
    "pre_exec": "Called in the master on HUP, before the new generation is exec'd.",
    "pre_request": "Called in the worker before each request is handled.",
    "post_request": "Called in the worker after each response.",
    "child_exit": "Called in the master after a worker exited.",
    "worker_exit": "Called in the worker just before it exits.",
    "nworkers_changed": "Called in the master when TTIN/TTOU change the number of workers.",
    "on_exit": "Called in the master just before it exits.",
    "ssl_context": "Called in the master with (config, default_factory) to make the TLS "
                   "listeners' ssl.SSLContext, at start and on HUP.",
}

ROWS = (
    _honoured("config", "Read settings from this file (Python or TOML)."),
    _honoured("wsgi_app", "The application, as MODULE:APP.", target="app"),
    _honoured("bind"),
    _honoured("backlog"),
    _honoured("workers", "Default: $WEB_CONCURRENCY as in Gunicorn, else the number of "
              "CPUs (Gunicorn: 1). 0 serves from one process."),
    _refused("worker_class", "forkserve workers are always gevent (one greenlet per "
             "connection) and serve WSGI: an ASGI, Tornado or custom worker class cannot run "
             "here; use gunicorn for it.",
             flags=("-k", "--worker-class"), harmless=_GEVENT_WORKERS, warned=_WSGI_WORKERS,
             warning="forkserve's workers are gevent: the application runs in greenlets, up "
             "to worker_connections requests at once per worker (gevent.monkey patches "
             "the standard library), not one request per process or thread. Code that "
             "blocks without yielding (a C database driver gevent cannot patch) holds up the "
             "worker's other requests meanwhile."),
    _ignored("threads", "forkserve's workers are gevent, not threads (as Gunicorn's gevent "
             "worker ignores threads): worker_connections sets how many requests a worker "
             "serves at once.", flags=("--threads",), harmless=(1,)),
    _honoured("worker_connections"),
    _honoured("max_requests"),
    _honoured("max_requests_jitter"),
    _honoured("timeout", "Same meaning: a worker whose event loop is blocked this long is "
              "killed (after worker_abort).", flags=("-t",)),
    _honoured("graceful_timeout"),
    _honoured("keepalive", "Seconds an idle keep-alive connection is kept (default 5; "
              "Gunicorn: 2).", target="keep_alive"),
    _honoured("limit_request_line"),
    _honoured("limit_request_fields"),
    _honoured("limit_request_field_size"),
    _honoured("reload", "Development tool: a changed source file reloads the application "
              "and its data in a new generation (as HUP), not just the workers."),
    _honoured("reload_engine", "auto and poll (forkserve polls); inotify is refused."),
    _honoured("reload_extra_files"),
    _ignored("spew", "forkserve has no line tracer; use python -X importtime or a profiler.",
             flags=("--spew",), switch=True, harmless=(False,)),
    _honoured("check_config", "Check the settings and load the application, then exit; "
              "exits non-zero when a setting is refused or invalid, and names every "
              "problem (refused settings, ignored ones, typos) in one run."),
    _honoured("print_config", "Print the effective settings and where each came from, then "
              "exit; --check-config also loads the application."),
    _ignored("preload_app", "forkserve always loads the application once, in the master, "
             "before forking: that is how workers share its data. Whatever the application "
             "starts while it is imported (threads, connections) is shared by all workers: "
             "start it in post_fork instead.", flags=("--preload",), switch=True,
             harmless=(True,)),
    _honoured("sendfile", "Same meaning: wsgi.file_wrapper's regular files go out with "
              "os.sendfile() unless sendfile = False (--no-sendfile)."),
    _refused("reuse_port", "Workers share the master's listening sockets; SO_REUSEPORT "
             "sockets per worker are not supported.", flags=("--reuse-port",), switch=True,
             harmless=(False,)),
    _honoured("chdir"),
    _honoured("daemon", "Same meaning (two forks, setsid, standard streams to /dev/null); "
              "for systems without a supervisor: under systemd leave it off."),
    _honoured("raw_env", "Set KEY=VALUE environment variables before the app loads."),
    _honoured("pidfile", target="pid", flags=("-p",)),
    _ignored("worker_tmp_dir", "it places Gunicorn's worker heartbeat files; forkserve's "
             "heartbeat is a shared-memory scoreboard and writes no file.",
             flags=("--worker-tmp-dir",), harmless=(None,)),
    _honoured("user"),
    _honoured("group"),
    _honoured("umask"),
    _ignored("initgroups", "forkserve always gives workers the user's supplementary groups "
             "(as initgroups = True).", flags=("--initgroups",), switch=True, harmless=(True,)),
    _ignored("tmp_upload_dir", "Gunicorn does not use it either. forkserve's wsgi.input "
             "reads from the socket; only a chunked body over 1 MiB is spooled, to an "
             "unnamed file in $TMPDIR (set TMPDIR to choose the directory).",
             harmless=(None,)),
    _honoured("secure_scheme_headers", "Same meaning and default."),
    _honoured("forwarded_allow_ips", "Same meaning and default (127.0.0.1,::1; '*'; CIDR)."),
    _honoured("accesslog", target="access_logfile"),
    _honoured("disable_redirect_access_to_syslog"),
    _honoured("access_log_format", "Same atoms and default line."),
    _honoured("errorlog", target="error_logfile", flags=("--log-file",)),
    _honoured("loglevel", target="log_level"),
    _honoured("capture_output"),
    _refused("logger_class", "Use logconfig_dict (or logconfig) to change handlers and "
             "formatters.", flags=("--logger-class",),
             harmless=("gunicorn.glogging.Logger",)),
    _honoured("logconfig", "logging.config.fileConfig; 'gunicorn.error' / "
              "'gunicorn.access' configure forkserve's loggers."),
    _honoured("logconfig_dict", "logging.config.dictConfig over Gunicorn's defaults; "
              "'gunicorn.error' / 'gunicorn.access' configure forkserve's loggers."),
    _honoured("logconfig_json", "Like logconfig_dict, read from a JSON file."),
    _honoured("syslog_addr", "Same forms (udp://, tcp://, unix://) and Linux default."),
    _honoured("syslog", "Same meaning and line format, through logging.handlers.SysLogHandler."),
    _honoured("syslog_prefix"),
    _honoured("syslog_facility"),
    _honoured("enable_stdio_inheritance"),
    _honoured("statsd_host", "Same metric names, types and datagrams (forkserve.statsd)."),
    _honoured("dogstatsd_tags"),
    _honoured("statsd_prefix"),
    _ignored("enable_backlog_metric", _ONLY_STATSD, flags=("--enable-backlog-metric",),
             switch=True, harmless=(False,)),
    _honoured("proc_name", target="name"),
    _ignored("default_proc_name", "Gunicorn sets it itself; forkserve names its processes "
             "after proc_name (or --name).", harmless=("gunicorn",)),
    _honoured("pythonpath", "Comma-separated directories put first on sys.path."),
    _refused("paste", "Paste Deployment is not supported: name the application as "
             "MODULE:APP.", flags=("--paste", "--paster"), harmless=(None,)),
    *(Row(name, "hook", note) for name, note in _HOOK_NOTES.items()),
    _honoured("proxy_protocol", "Same modes (off, v1, v2, auto): sets REMOTE_ADDR and "
              "REMOTE_PORT."),
    _honoured("proxy_allow_ips", "Same meaning and default."),
    _honoured("protocol", "Same values (http, uwsgi), for every bind address without a "
              "uwsgi: or http: prefix; docs/uwsgi.md."),
    _honoured("uwsgi_allow_ips", "Same meaning: peers a uwsgi listener serves."),
    _honoured("keyfile"),
    _honoured("certfile", "Same meaning: TLS on every HTTP listener (uwsgi ones stay plain); "
              "read in the master, again on HUP."),
    _ignored("ssl_version", "Gunicorn ignores it too (deprecated since 21.0): the protocol "
             "is negotiated; use ciphers or the ssl_context hook.", flags=("--ssl-version",),
             harmless=(2,)),
    _honoured("cert_reqs"),
    _honoured("ca_certs"),
    _honoured("suppress_ragged_eofs"),
    _honoured("do_handshake_on_connect", "Accepted: the handshake always runs when the "
              "connection starts, under header_timeout."),
    _honoured("ciphers"),
    _ignored("http_protocols", _ONLY_H1, flags=("--http-protocols",), harmless=("h1",)),
    _refused("http2_cleartext", _HTTP2, flags=("--http2-cleartext",), harmless=("off",)),
    _ignored("http2_max_concurrent_streams", _ONLY_H1,
             flags=("--http2-max-concurrent-streams",), harmless=(100,)),
    _ignored("http2_initial_window_size", _ONLY_H1, flags=("--http2-initial-window-size",),
             harmless=(65535,)),
    _ignored("http2_max_frame_size", _ONLY_H1, flags=("--http2-max-frame-size",),
             harmless=(16384,)),
    _ignored("http2_max_header_list_size", _ONLY_H1, flags=("--http2-max-header-list-size",),
             harmless=(65536,)),
    _ignored("raw_paste_global_conf", "Gunicorn uses it only with paste, which forkserve does "
             "not support.", flags=("--paste-global",), harmless=([],)),
    _refused("permit_obsolete_folding", _STRICT, flags=("--permit-obsolete-folding",),
             switch=True, harmless=(False,)),
    _refused("strip_header_spaces", _STRICT, flags=("--strip-header-spaces",), switch=True,
             harmless=(False,)),
    _refused("permit_unconventional_http_method", _STRICT,
             flags=("--permit-unconventional-http-method",), switch=True, harmless=(False,)),
    _refused("permit_unconventional_http_version", _STRICT,
             flags=("--permit-unconventional-http-version",), switch=True, harmless=(False,)),
    _refused("casefold_http_method", _STRICT, flags=("--casefold-http-method",), switch=True,
             harmless=(False,)),
    _refused("forwarder_headers", "Headers with underscores are always dropped (no trusted "
             "forwarder may set SCRIPT_NAME or PATH_INFO through them); set SCRIPT_NAME in the "
             "environment instead (--env SCRIPT_NAME=/prefix).", flags=("--forwarder-headers",),
             harmless=("SCRIPT_NAME,PATH_INFO", "")),
    _refused("header_map", "Headers with underscores are always dropped (as header_map = "
             "'drop'); mapping them into the environ ('dangerous') is not supported.",
             flags=("--header-map",), harmless=("drop",), warned=("refuse",),
             warning="forkserve serves such a request without the headers that have "
             "underscores (as header_map = 'drop') instead of refusing it."),
    _ignored("asgi_loop", _ONLY_ASGI, flags=("--asgi-loop",), harmless=("auto",)),
    _ignored("asgi_lifespan", _ONLY_ASGI, flags=("--asgi-lifespan",), harmless=("auto",)),
    _ignored("asgi_disconnect_grace_period", _ONLY_ASGI,
             flags=("--asgi-disconnect-grace-period",), harmless=(3,)),
    _ignored("websocket_max_message_size", _ONLY_ASGI, flags=("--websocket-max-message-size",),
             harmless=(16777216,)),
    _ignored("http_parser", "forkserve has one HTTP parser (forkserve.http.h1).",
             flags=("--http-parser",), harmless=("auto", "python")),
    _ignored("root_path", "Gunicorn passes it to ASGI applications only; to mount a WSGI "
             "application under a prefix, set SCRIPT_NAME in the environment (--env "
             "SCRIPT_NAME=/prefix), as in Gunicorn.", flags=("--root-path",), harmless=("",)),
    _refused("dirty_apps", _DIRTY, flags=("--dirty-app",), harmless=([],)),
    _ignored("dirty_workers", _ONLY_DIRTY, flags=("--dirty-workers",), harmless=(0,)),
    _ignored("dirty_timeout", _ONLY_DIRTY, flags=("--dirty-timeout",), harmless=(300,)),
    _ignored("dirty_threads", _ONLY_DIRTY, flags=("--dirty-threads",), harmless=(1,)),
    _ignored("dirty_graceful_timeout", _ONLY_DIRTY, flags=("--dirty-graceful-timeout",),
             harmless=(30,)),
    _ignored("on_dirty_starting", _ONLY_DIRTY),
    _ignored("dirty_post_fork", _ONLY_DIRTY),
    _ignored("dirty_worker_init", _ONLY_DIRTY),
    _ignored("dirty_worker_exit", _ONLY_DIRTY),
    _refused("control_socket", _CONTROL, flags=("--control-socket",)),
    _ignored("control_socket_mode", "Gunicorn uses it only for its control socket, which "
             "forkserve does not have: " + _CONTROL, flags=("--control-socket-mode",),
             harmless=(384,)),
    _ignored("control_socket_disable", "forkserve has no control socket: " + _CONTROL,
             flags=("--no-control-socket",), switch=True, harmless=(True,)),
)

BY_NAME = {row.name: row for row in ROWS}


class Refused(ValueError):
    """A Gunicorn setting forkserve cannot honour; the message says why and what to do."""


def translate(name: str, value):
    """What Gunicorn setting `name` = `value` asks of forkserve:
    ((forkserve setting, value) or None, a warning or None). None and None:
    it asks for nothing forkserve does differently. Raises Refused (a
    ValueError) with the reason when forkserve cannot give what it asks."""
    row = BY_NAME[name]
    if row.kind == "honoured":
        return (row.target, value), None
    if row.kind == "hook":
        raise Refused(f"{name} is a server hook: define it as a function in a config file")
    if one_of(value, row.harmless):
        return None, None
    shown = "a function" if callable(value) else repr(value)
    if row.kind == "ignored":
        return None, f"{name} = {shown} has no effect under forkserve: {row.note}"
    if one_of(value, row.warned):
        return None, f"{name} = {shown} has no effect under forkserve: {row.warning}"
    raise Refused(f"forkserve does not support {name} = {shown}: {row.note}")


def settings_from_file(namespace: dict, known: set, path: str, findings, *, python: bool):
    """Split a config file's names into ({setting: raw value}, {hook: function}).

    `known` are forkserve's setting names. In a Python file, names starting
    with '_', modules, classes and functions that are not hooks are the
    file's own helpers, not settings. Any other unknown name is an error
    naming it (a typo must not pass as a setting). Every error and warning
    goes to `findings` (a forkserve.config.values.Findings), so that one
    reading names them all.
    """
    values, hooks = {}, {}
    hook_names = {**HOOKS, **FORKSERVE_HOOKS}
    for key, value in namespace.items():
        name = key.replace("-", "_")
        if python and (name.startswith("_") or isinstance(value, (types.ModuleType, type))):
            continue
        try:
            if name in hook_names:
                hooks[name] = _check_hook(name, value, hook_names[name])
            elif python and callable(value) and name not in known and name not in BY_NAME:
                close = difflib.get_close_matches(name, hook_names, n=1, cutoff=0.8)
                if close:  # else a helper function of the file's own
                    raise ValueError(f"function {key!r} is not a server hook; did you mean "
                                     f"{close[0]!r}?")
            elif name in ("app", "wsgi_app"):
                values["app"] = value
            elif name in known:
                values[name] = value
            elif name in BY_NAME:
                translated, warning = translate(name, value)
                if warning:
                    findings.warnings.append(f"config file {path}: {warning}")
                if translated is not None:
                    values[translated[0]] = translated[1]
            else:
                close = difflib.get_close_matches(name, [*known, *BY_NAME, *hook_names], n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise ValueError(f"unknown setting {key!r}{hint} (to keep a helper value in "
                                 "the file, start its name with '_')")
        except ValueError as exc:  # Refused too
            findings.errors.append(f"config file {path}: {exc}")
    return values, hooks


def add_arguments(parser, taken, honoured=()):
    """Add Gunicorn's flags that forkserve's own settings do not already have.

    --help names them on one line instead of describing each: docs/gunicorn.md
    says what forkserve does with every one. `honoured`: flags of forkserve's
    settings that --help names here too (docs/settings.md describes them)."""
    names = list(honoured)
    for row in ROWS:
        flags = [flag for flag in row.flags if flag not in taken]
        if not flags:
            continue
        names += flags
        dest = DEST_PREFIX + row.name
        if row.switch:
            parser.add_argument(*flags, dest=dest, action="store_const", const=True,
                                default=None, help=argparse.SUPPRESS)
        else:
            parser.add_argument(*flags, dest=dest, default=None, help=argparse.SUPPRESS)
    text = ("Also accepted, so a Gunicorn command line works unchanged; each is honoured or "
            "refused with the reason (docs/gunicorn.md): " + " ".join(names))
    # The parser keeps descriptions as written: wrap here, never inside a flag's name.
    parser.add_argument_group("Gunicorn's flags", textwrap.fill(
        text, width=76, break_on_hyphens=False, break_long_words=False))


def _check_hook(name, value, arity):
    if not callable(value):
        raise ValueError(f"{name} must be a function taking {arity} argument(s), not "
                         f"{type(value).__name__}")
    try:
        inspect.signature(value).bind(*range(arity))
    except TypeError:
        raise ValueError(f"hook {name} must take {arity} argument(s)") from None
    except ValueError:
        pass  # no signature to check (a builtin); Gunicorn accepts it too
    return value


def table() -> str:
    """docs/gunicorn.md's table of every Gunicorn setting and what forkserve does with it."""
    lines = ["| Gunicorn setting | forkserve | Notes |", "|---|---|---|"]
    for row in ROWS:
        if row.kind == "honoured":
            what = "honoured" if row.target == row.name else f"honoured as `{row.target}`"
        elif row.kind == "hook":
            what = "hook"
        else:
            what = "refused" if row.kind == "refused" else "ignored, with a warning"
            if row.harmless:
                shown = ", ".join(repr(value) for value in row.harmless)
                what += f" (except {shown}: nothing to do)"
        note = row.note
        if row.warned:
            shown = ", ".join(repr(value) for value in row.warned)
            note += f" {shown}: ignored, with a warning: {row.warning}"
        lines.append(f"| `{row.name}` | {what} | {note} |")
    return "\n".join(lines)


if __name__ == "__main__":  # python -m forkserve.config.gunicorn prints docs/gunicorn.md's table
    import sys
    sys.stdout.write(table() + "\n")
