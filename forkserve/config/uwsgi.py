"""What forkserve does with every uWSGI option, declared once.

A uWSGI user switches by running `forkserve --ini uwsgi.ini` (or `-c
uwsgi.ini`) on the ini file they have, or passes the same options as
uWSGI's long flags (`forkserve --socket :3031 --module shop.wsgi --master`):
an ini file's `[uwsgi]` section is read as
uWSGI reads it (repeated keys, `%(name)` and the common magic placeholders,
`$(ENV)`), and each option has one `Option` row here:

  honoured  forkserve does what uWSGI does, under the forkserve setting(s)
            its `apply` returns;
  mapped    forkserve does the nearest thing it has, which differs as the
            note says (the note is logged once at start);
  warned    no effect under forkserve, for the reason the note gives (logged
            once at start);
  refused   behaviour a user relies on that forkserve cannot give: starting
            is an error that names the option, says why and what to do.

A value in `harmless` (what forkserve does anyway, as lazy-apps = false)
asks for nothing forkserve does differently: no note, no warning, no error,
by the same rule as Gunicorn's side (forkserve.config.values.one_of).

An option that is not in the table is an error too (uWSGI's own `strict`),
unless it is a variable the file uses in a `%(name)` placeholder. Every
problem in the file is reported at once, so `--check-config` lists them all
in one run.

This module only decides: `translate` turns an ini file's text into
forkserve settings, warnings and errors; `table` renders docs/uwsgi.md's
table. forkserve.config.files reads the file.
"""

import dataclasses
import difflib
import os
import re
import socket
import time
from typing import Callable

from forkserve.config.values import one_of

__all__ = ["Option", "OPTIONS", "BY_NAME", "Translation", "translate", "translate_flags",
           "split_flags", "is_switch", "parse_ini",
           "looks_like_uwsgi_ini", "table", "PLACEHOLDERS"]


@dataclasses.dataclass(frozen=True)
class Option:
    name: str
    kind: str                              # "honoured", "mapped", "warned" or "refused"
    note: str
    apply: Callable | None = None          # (value, context) -> {setting: raw value}
    aliases: tuple = ()
    harmless: tuple = ()                   # values that ask nothing forkserve does differently


@dataclasses.dataclass
class Translation:
    """What an ini file comes to: forkserve settings (raw values, as a config
    file gives them, "app" among them), the warnings to log once at start,
    and the errors that stop it (all of them)."""
    values: dict
    warnings: list
    errors: list


# --- value parsers: uWSGI's spellings in, raw forkserve values out (ValueError) ----

_TRUE = ("", "1", "true", "yes", "on", "y", "t")
_FALSE = ("0", "false", "no", "off", "n", "f")


def _bool(value):
    text = value.strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError("expected true or false")


def _number(value):
    """A whole number, with uWSGI's k/m/g suffixes (powers of 1024)."""
    text = value.strip().lower()
    scale = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}.get(text[-1:], 1)
    digits = text[:-1] if scale > 1 else text
    if not digits.isdigit():
        raise ValueError("expected a whole number")
    return int(digits) * scale


def address(value, protocol):
    """A uWSGI socket address as a forkserve bind address speaking `protocol`:
    HOST:PORT or :PORT is TCP, anything else a unix socket path."""
    text = value.strip()
    if not text:
        raise ValueError("expected an address such as 127.0.0.1:3031, :3031 or /run/app.sock")
    if text.startswith("@"):
        raise ValueError("abstract unix sockets (@name) are not supported; use a path such as "
                         "/run/app.sock, and the same path in nginx's uwsgi_pass unix:")
    if text.startswith("="):
        raise ValueError("sockets passed by descriptor (=N) are not supported; bind an address, "
                         "or use systemd socket activation (docs/deployment.md)")
    if ":" in text and "/" not in text.partition(":")[0]:
        return f"{protocol}:{text}"
    return f"{protocol}:unix:{text}"


def _set(setting, parse=lambda value: value.strip()):
    """apply(): the setting gets the parsed value."""
    return lambda value, context: {setting: parse(value)}


def _bind(protocol):
    return lambda value, context: {"bind": address(value, protocol)}


def _switch_on(value, context):
    _bool(value)  # must be a boolean; either way forkserve behaves so
    return {}


def _module(value, context):
    return {"_module": value.strip()}


def _wsgi_file(value, context):
    path = value.strip()
    stem, extension = os.path.splitext(os.path.basename(path))
    if extension != ".py" or not stem.isidentifier():
        raise ValueError(f"forkserve imports the application as a module, and {path!r} cannot "
                         "be imported by name: rename it to a .py file whose name is a Python "
                         "identifier, or name its module with module = package.module:callable")
    directory = os.path.dirname(os.path.join(context["dir"], path))
    return {"_module": stem, "pythonpath": directory}


def _chmod_socket(value, context):
    text = value.strip() or "666"  # uWSGI: chmod-socket alone means 666
    if not re.fullmatch("[0-7]{3,4}", text):
        raise ValueError("expected an octal mode such as 660")
    return {"umask": oct(0o777 & ~int(text, 8))}


def _cpu_affinity(value, context):
    count = _number(value)
    return {"cpu_affinity": "on" if count else "off"}


def _stats(value, context):
    return {"stats": address(value, "http").removeprefix("http:")}


def _megabytes(value, context):
    return {"max_worker_memory": _number(value)}


def _touch(value, context):
    return {"touch_reload": os.path.join(context["dir"], value.strip())}


def _env(value, context):
    text = value.strip()
    if "=" not in text:
        # uWSGI's env = NAME alone unsets NAME; forkserve only sets
        raise ValueError("expected NAME=VALUE")
    return {"raw_env": text}


def _procname(value, context):
    return {"name": value.strip()}


def _die_on_term(value, context):
    return {} if _bool(value) else {"_warn": "die-on-term = false: TERM reloads uWSGI 2.0 "
                                    "(brutally); it stops forkserve gracefully. Send HUP to "
                                    "reload (docs/uwsgi.md, signals)"}


def _master(value, context):
    return {} if _bool(value) else {"_warn": "master = false: forkserve always runs a master "
                                    "process that forks and supervises the workers (-w 0 "
                                    "serves from one process instead)"}


def _protocol(value, context):
    name = value.strip().lower()
    if name not in ("uwsgi", "http"):
        raise ValueError("forkserve speaks uwsgi and http; FastCGI and SCGI are not supported")
    return {"protocol": name}


def _honoured(name, apply, note="Same meaning.", aliases=()):
    return Option(name, "honoured", note, apply, aliases)


def _mapped(name, apply, note, aliases=()):
    return Option(name, "mapped", note, apply, aliases)


def _warned(name, note, aliases=(), harmless=()):
    return Option(name, "warned", note, _switch_or_any, aliases, harmless)


def _refused(name, note, aliases=(), harmless=()):
    return Option(name, "refused", note, None, aliases, harmless)


def _switch_or_any(value, context):
    return {}


_NO_STATIC = ("forkserve serves the application only: serve static files from nginx "
              "(location /static/ { alias ...; }) or with WhiteNoise in the application.")
_ONE_SERVER = ("forkserve runs one application server, not uWSGI's process manager: run each "
               "application as its own forkserve service (systemd units).")
_ROUTER = "uWSGI's internal routing is not part of forkserve: route in nginx."
_TLS = ("TLS is not served by forkserve: terminate it in nginx (or a load balancer), which "
        "passes HTTPS=on to a uwsgi listener.")
_DAEMON = ("forkserve does not daemonize or run side processes: run it under systemd (or "
           "another supervisor) and run the other program as its own service.")

OPTIONS = (
    # --- the application ---
    _honoured("module", _module, "MODULE or MODULE:CALLABLE; the application forkserve loads "
              "(callable defaults to application, as in uWSGI).", aliases=("wsgi", "w")),
    _honoured("callable", _set("_callable"), "The callable's name in the module."),
    _honoured("wsgi-file", _wsgi_file, "A .py file: its directory goes first on pythonpath "
              "and it is imported as a module (a .wsgi file must be renamed to .py).",
              aliases=("file",)),
    _honoured("chdir", _set("chdir"), "Same meaning: the directory changed to before loading."),
    _honoured("pythonpath", _set("pythonpath"), "Same meaning; repeat for several.",
              aliases=("python-path", "pp")),
    _honoured("env", _env, "NAME=VALUE set before the application loads; repeat for several."),
    _honoured("need-app", _switch_on, "Always so: forkserve exits if the application does "
              "not load."),
    _honoured("py-callos-afterfork", _switch_on, "Always so: workers are forked by Python's "
              "os.fork, which runs Python's after-fork handlers."),
    _warned("lazy-apps", "forkserve loads the application once, in the master, before forking, "
            "always: that is how workers share its memory. What lazy-apps guards against "
            "(connections or threads opened at import and shared across fork) is not guarded "
            "here: open them lazily or in a post_fork hook (Django opens database connections "
            "per request, so it is safe).", aliases=("lazy",), harmless=(False,)),
    _refused("paste", "forkserve loads MODULE:APP: write a module whose application is "
             "paste.deploy.loadapp('config:...'), and name it in module ="),
    _refused("mount", "one application per server: mount it under a prefix with SCRIPT_NAME "
             "(env = SCRIPT_NAME=/prefix) and route other prefixes in nginx."),
    _honoured("manage-script-name", _switch_on, "Always so: a SCRIPT_NAME from nginx is "
              "stripped from PATH_INFO."),
    # --- listeners ---
    _honoured("socket", _bind("uwsgi"), "A listener speaking the uwsgi protocol (nginx's "
              "uwsgi_pass): HOST:PORT, :PORT or a unix socket path.",
              aliases=("uwsgi-socket", "s")),
    _honoured("http-socket", _bind("http"), "A listener speaking HTTP/1.1."),
    _mapped("http", _bind("http"), "uWSGI starts an HTTP router process that forwards to its "
            "workers; forkserve's workers serve HTTP on this address themselves."),
    _honoured("protocol", _protocol, "The protocol of socket = listeners (uwsgi or http)."),
    _honoured("listen", _set("backlog", lambda value: _number(value)), "The listen queue "
              "length (backlog; uWSGI's default is 100, forkserve's 2048)."),
    _mapped("chmod-socket", _chmod_socket, "forkserve creates unix sockets with the mode its "
            "umask leaves: the umask becomes 777 minus this mode (660 gives 117), which also "
            "applies to the pid file and the logs."),
    _refused("chown-socket", "forkserve does not chown its socket: run it as the user nginx "
             "shares a group with (uid/gid) and use chmod-socket."),
    _mapped("buffer-size", _set("limit_request_field_size", lambda value: _number(value)),
            "uWSGI's buffer bounds a packet's vars together; forkserve bounds each header (the "
            "value becomes limit_request_field_size) and a packet at 64 KiB (its format's "
            "limit), so a buffer raised for big cookies keeps working.", aliases=("b",)),
    _honoured("limit-post", _set("limit_request_body", lambda value: _number(value)),
              "Largest request body in bytes (413 over it)."),
    _warned("post-buffering", "forkserve reads the body as the application asks for it, and "
            "nginx buffers it before passing it on (uwsgi_request_buffering)."),
    _warned("socket-timeout", "forkserve bounds each wait with header_timeout, body_timeout "
            "and send_timeout (--header-timeout...)."),
    _warned("http-timeout", "forkserve bounds each wait with header_timeout, body_timeout and "
            "send_timeout (--header-timeout...)."),
    _warned("http-keepalive", "forkserve's HTTP listeners keep connections alive (keep_alive, "
            "5 s) unless --keep-alive 0."),
    _warned("so-keepalive", "TCP keep-alive probes are the kernel's defaults here.",
            harmless=(False,)),
    _warned("reuse-port", "workers share the master's listening sockets; no SO_REUSEPORT is "
            "needed to restart (HUP reloads without closing them).", harmless=(False,)),
    _refused("shared-socket", "bind the address with socket =, http-socket = or http ="),
    _refused("https", _TLS, aliases=("https-socket", "ssl-socket")),
    _refused("http2", _TLS),
    _refused("fastcgi-socket", "forkserve speaks uwsgi and HTTP: use uwsgi_pass or proxy_pass "
             "in nginx instead of fastcgi_pass."),
    _refused("scgi-socket", "forkserve speaks uwsgi and HTTP: use uwsgi_pass or proxy_pass in "
             "nginx instead of scgi_pass."),
    # --- processes ---
    _honoured("processes", _set("workers", lambda value: _number(value)), "The number of "
              "worker processes (without it forkserve starts one per CPU; uWSGI one).",
              aliases=("workers", "p")),
    _honoured("master", _master, "forkserve always runs a master (see -w 0 for none).",
              aliases=("M",)),
    _mapped("gevent", _set("worker_connections", lambda value: _number(value)),
            "uWSGI's async cores per worker: forkserve workers are gevent always, and this "
            "is their connection cap (worker_connections)."),
    _warned("threads", "forkserve workers are gevent: concurrent requests in a worker are "
            "greenlets, up to worker_connections (the gevent option)."),
    _warned("enable-threads", "no effect: Python threads run in forkserve workers (the GIL is "
            "never disabled).", harmless=(True,)),
    _warned("thunder-lock", "no effect: forkserve's workers balance accept() between them "
            "(--no-balance to race)."),
    _warned("single-interpreter", "no effect: forkserve runs one interpreter per process.",
            harmless=(True,)),
    _honoured("strict", _switch_on, "Always so: an unknown option is an error."),
    _warned("offload-threads", "forkserve sends files with sendfile() from the worker's event "
            "loop.", harmless=(0,)),
    _warned("cheaper", "forkserve runs a fixed number of workers (processes); TTIN and TTOU "
            "add or remove one.", aliases=("cheaper-algo", "cheaper-initial", "cheaper-step",
                                           "cheaper-overload", "cheaper-rss-limit-soft",
                                           "cheaper-rss-limit-hard")),
    _mapped("cpu-affinity", _cpu_affinity, "forkserve pins each worker to one CPU (on) or none "
            "(0: off); uWSGI's N CPUs per worker becomes one."),
    _mapped("harakiri", _set("timeout", lambda value: _number(value)), "A worker whose event "
            "loop is blocked this many seconds is killed and replaced (timeout). uWSGI counts "
            "a request's time; a gevent worker waiting on I/O is not blocked, so only code "
            "that holds the loop (CPU, a blocking call) is cut."),
    _warned("harakiri-verbose", "forkserve logs the worker it kills for timeout (and calls the "
            "worker_abort hook)."),
    _honoured("max-requests", _set("max_requests", lambda value: _number(value)),
              "Recycle a worker gracefully after this many requests.", aliases=("R",)),
    _mapped("max-requests-delta", _set("max_requests_jitter", lambda value: _number(value)),
            "A random 0..N added per worker (uWSGI adds N times the worker's number)."),
    _warned("max-worker-lifetime", "forkserve does not recycle workers by age: use "
            "max-requests or reload-on-rss (max_worker_memory).", harmless=(0,)),
    _mapped("reload-on-rss", _megabytes, "forkserve limits private memory, not RSS: a worker "
            "is recycled gracefully when its private anonymous memory passes this many MiB "
            "(max_worker_memory); pages shared with the master do not count.",
            aliases=("evil-reload-on-rss",)),
    _warned("reload-on-as", "forkserve limits private memory (reload-on-rss), not address "
            "space.", aliases=("evil-reload-on-as",)),
    _mapped("worker-reload-mercy", _set("graceful_timeout", lambda value: _number(value)),
            "Seconds a draining worker may finish its requests (graceful_timeout).",
            aliases=("reload-mercy", "mule-reload-mercy")),
    _honoured("touch-reload", _touch, "Reload gracefully (as HUP) when this file's "
              "modification time changes; repeat for several."),
    _mapped("py-autoreload", _set("reload", lambda value: bool(_number(value))),
            "--reload: a changed source file reloads (forkserve checks every second)."),
    _honoured("die-on-term", _die_on_term, "TERM stops forkserve gracefully, with or without "
              "it (uWSGI 2.0 reloads on TERM without it)."),
    _honoured("vacuum", _switch_on, "Always so: the unix sockets and the pid file are removed "
              "on exit."),
    _honoured("uid", _set("user"), "Switch workers to this user after binding."),
    _honoured("gid", _set("group"), "Switch workers to this group after binding."),
    _honoured("umask", _set("umask", lambda value: oct(int(value.strip(), 8))),
              "Same meaning (octal, as uWSGI reads it)."),
    _warned("home", "forkserve runs in the interpreter it was started with: start it from the "
            "virtualenv (/path/to/venv/bin/forkserve).",
            aliases=("virtualenv", "venv", "pyhome", "H")),
    _warned("plugins", "no effect: forkserve is a Python server; no plugin is loaded.",
            aliases=("plugin",)),
    _honoured("auto-procname", _switch_on, "Always so: processes are titled "
              "'forkserve: master/worker N'."),
    _honoured("procname-prefix", _procname, "The process-title prefix (name).",
            aliases=("procname-prefix-spaced",)),
    _warned("honour-stdin", "forkserve workers read no stdin.", harmless=(False,)),
    # --- files, logging, stats ---
    _honoured("pidfile", _set("pid"), "The master's PID, written at start, removed on exit.",
              aliases=("pidfile2", "safe-pidfile", "safe-pidfile2")),
    _mapped("logto", _set("error_logfile"), "The server log goes to this file (forkserve's "
            "access log is separate: access_logfile).", aliases=("logto2",)),
    _honoured("disable-logging", _switch_on, "forkserve logs no request unless "
              "access_logfile is set."),
    _warned("log-4xx", "forkserve logs requests only to its access log (access_logfile).",
            aliases=("log-5xx", "log-slow", "log-big", "log-zero", "log-sendfile",
                     "log-ioerror")),
    _warned("log-format", "forkserve's access log uses Gunicorn's atoms (access_log_format).",
            aliases=("logformat", "log-date", "logdate", "log-micros")),
    _warned("log-master", "forkserve's master writes the log itself.", harmless=(True,)),
    _warned("log-reopen", "forkserve reopens its log files on USR1."),
    _warned("log-maxsize", "forkserve does not rotate its logs: rotate with logrotate "
            "(copytruncate) or send USR1 after moving them."),
    _refused("daemonize", _DAEMON, aliases=("daemonize2",)),
    _mapped("stats", _stats, "forkserve's stats server: HTTP with a dashboard at /, "
            "JSON at /json and Prometheus text at /metrics, not uWSGI's stats JSON (uwsgitop "
            "does not read it).", aliases=("stats-server",)),
    _warned("stats-http", "forkserve's stats server always speaks HTTP.", harmless=(True,)),
    _warned("memory-report", "forkserve reports memory with --stats and --memory-log-interval."),
    _refused("master-fifo", "forkserve is controlled by signals: HUP reloads, TERM stops, "
             "TTIN/TTOU change the workers (docs/signals.md)."),
    # --- what forkserve does not have ---
    _refused("static-map", _NO_STATIC, aliases=("static-map2", "static-expires", "check-static",
                                                "static-index", "static-safe")),
    _refused("route", _ROUTER, aliases=("route-if", "route-run", "route-uri", "route-host",
                                        "response-route", "final-route", "error-route")),
    _refused("emperor", _ONE_SERVER, aliases=("vassal", "emperor-tyrant")),
    _refused("spooler", "use a task queue (Celery, RQ) as its own service.",
             aliases=("spooler-processes",)),
    _refused("mule", _DAEMON, aliases=("mules", "farm")),
    _refused("attach-daemon", _DAEMON, aliases=("smart-attach-daemon", "attach-daemon2")),
    _refused("cron", "run scheduled jobs with systemd timers or cron.", aliases=("unique-cron",)),
    _refused("ini", "forkserve reads one ini file: copy the included file's options into it.",
             aliases=("include", "inherit", "json", "yaml", "xml")),
    _refused("if-env", "uWSGI's config logic is not read: write the resolved options.",
             aliases=("if-not-env", "if-exists", "if-not-exists", "if-file", "if-dir",
                      "if-opt", "endif", "for", "endfor")),
    _refused("add-header", "set response headers in the application or in nginx "
             "(add_header)."),
    _refused("cache2", "uWSGI's caches are not part of forkserve: use the application's cache "
             "(Redis, memcached) or forkserve's shared store (docs/memory.md).",
             aliases=("cache",)),
    _refused("hook-master-start", "uWSGI's hooks are not run: use forkserve's Python hooks "
             "(docs/gunicorn.md) in a config file.",
             aliases=("hook-pre-app", "hook-post-app", "hook-accepting",
                      "hook-as-user", "hook-as-root")),
)

BY_NAME = {name: option for option in OPTIONS for name in (option.name, *option.aliases)}

#: the settings a repeated option adds to instead of replacing ("," joins)
_ACCUMULATE = {"bind": list, "raw_env": list, "touch_reload": list, "pythonpath": ","}

#: placeholders forkserve expands, as uWSGI does (docs/uwsgi.md lists them)
PLACEHOLDERS = {
    "d": "the directory of the ini file, with a trailing /",
    "p": "the ini file's absolute path",
    "s": "the ini file's name",
    "n": "the ini file's name without its extension",
    "e": "the ini file's extension",
    "c": "the name of the ini file's directory",
    "x": "the section read (uwsgi)",
    "h": "the host name",
    "k": "the number of CPUs",
    "u": "the uid",
    "U": "the user name",
    "g": "the gid",
    "G": "the group name",
    "t": "the Unix time, in seconds",
    "%": "a literal %",
}


def _magic(path, section):
    import grp
    import pwd
    directory = os.path.dirname(path)
    name = os.path.basename(path)
    stem, extension = os.path.splitext(name)
    return {"d": directory.rstrip("/") + "/", "p": path, "s": name, "n": stem,
            "e": extension.lstrip("."), "c": os.path.basename(directory), "x": section,
            "h": socket.gethostname(), "k": str(os.cpu_count() or 1), "u": str(os.getuid()),
            "U": pwd.getpwuid(os.getuid()).pw_name, "g": str(os.getgid()),
            "G": grp.getgrgid(os.getgid()).gr_name, "t": str(int(time.time())), "%": "%"}


def parse_ini(text, section="uwsgi"):
    """The (line number, key, value) entries of `section`, in order, repeats
    kept; None if the file has no such section. uWSGI's ini: `key = value`,
    `;` and `#` comment lines, a key alone meaning true."""
    entries, found, inside = [], False, False
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            inside = line[1:-1].strip() == section
            found = found or inside
            continue
        if inside:
            key, _, value = line.partition("=")
            entries.append((number, key.strip(), value.strip()))
    return entries if found else None


def looks_like_uwsgi_ini(text):
    """True if the file's first section is [uwsgi] (a uWSGI ini given to -c)."""
    for line in text.splitlines():
        line = line.strip()
        if line and line[0] not in "#;":
            return line == "[uwsgi]"
    return False


def translate(text, path, environ, section="uwsgi"):
    """An ini file's [section] as forkserve settings (a Translation).

    Placeholders are expanded in uWSGI's order: the magic ones (%d, %n...)
    as the file is read; then $(ENV) in every option's value; then
    %(name), from the first option, variable or set-placeholder of that
    name anywhere in the file (a placeholder's value is taken as written,
    so a $(ENV) in it stays unexpanded, as in uWSGI), recursively."""
    path = os.path.abspath(path)
    where = os.path.basename(path)
    entries = parse_ini(text, section)
    if entries is None:
        return Translation({}, [], [f"{path} has no [{section}] section; forkserve reads "
                                    f"uWSGI's options from it"])
    magic = _magic(path, section)
    defined, problems, read = {}, {}, []
    for number, key, raw in entries:
        value = _substitute(_MAGIC, raw, lambda letter: magic.get(letter),
                            problems.setdefault(number, []), _magic_unknown)
        if key in ("set-placeholder", "set-ph"):
            name, sep, content = value.partition("=")
            if not sep:
                problems[number].append("expected NAME=VALUE")
            defined.setdefault(name.strip(), content.strip())
            continue
        value = _substitute(_ENV, value, lambda name: _getenv(name, environ),
                            problems[number], "the environment variable {} is not set")
        defined.setdefault(key, value)
        read.append((number, key, raw, value))
    defined.setdefault("here", os.path.dirname(path))  # Paste's name for %d, without the /
    rows = [(f"{where} line {number}", key, raw,
             _references(value, defined, problems[number]), problems[number])
            for number, key, raw, value in read]
    errors = [f"{where} line {number}: {key}: {problem}" for number, key, _ in entries
              if key in ("set-placeholder", "set-ph") for problem in problems[number]]
    referenced = set(re.findall(r"%\(([^)]*)\)", text))
    return _apply(rows, referenced, {"dir": os.path.dirname(path)}, errors, where)


def translate_flags(pairs, cwd):
    """uWSGI options given on the command line, [(name, value)], as forkserve
    settings (a Translation); relative paths are from `cwd`."""
    read = [(f"command line --{key}", key, value, value, []) for key, value in pairs]
    return _apply(read, set(), {"dir": cwd}, [], "the command line")


def _apply(read, referenced, context, errors, where):
    """The rows of the table applied to [(label, key, raw, value, problems)]."""
    values, warnings, notes = {}, [], {}
    for line, key, raw, value, problems in read:
        option = BY_NAME.get(key)
        if option is None:
            if key not in referenced:
                close = difflib.get_close_matches(key, BY_NAME, n=1, cutoff=0.75)
                hint = f"did you mean {close[0]}? " if close else ""
                errors.append(f"{line}: unknown uWSGI option {key!r}: {hint}remove it, or see "
                              "docs/uwsgi.md for what forkserve does with each option (a value "
                              "only used in %(" + key + ") placeholders is fine)")
            continue
        # a switch given alone (lazy-apps =, --lazy-apps) is on, as in uWSGI
        harmless = one_of(value if value.strip() or not is_switch(option) else "true",
                          option.harmless)
        if option.kind == "refused":
            if harmless:
                continue
            errors.append(f"{line}: {key} is not supported by forkserve: {option.note}")
            continue
        if problems and option.kind != "warned":  # a warned value is never used
            errors += [f"{line}: {key} = {raw}: {problem}" for problem in problems]
            continue
        try:
            changes = option.apply(value, context)
        except ValueError as exc:
            errors.append(f"{line}: {key} = {raw}: {exc}")
            continue
        warning = changes.pop("_warn", None)
        if warning:
            warnings.append(f"{line}: {warning}")
        if option.kind in ("mapped", "warned") and option.name not in notes and not harmless:
            notes[option.name] = f"{line}: {key} = {value}: " + (
                option.note if option.kind == "mapped" else "ignored: " + option.note)
        for setting, setting_value in changes.items():
            joined = _ACCUMULATE.get(setting)
            if joined is list:
                values.setdefault(setting, []).append(setting_value)
            elif joined and setting in values:
                values[setting] += joined + setting_value
            else:
                values[setting] = setting_value
    warnings = list(notes.values()) + warnings
    module = values.pop("_module", None)
    callable_ = values.pop("_callable", None)
    if module:
        if ":" not in module:
            module += ":" + (callable_ or "application")
        elif callable_:
            errors.append(f"{where}: callable = {callable_} and module = {module} both name "
                          "the callable; keep one")
        values["app"] = module
    elif callable_:
        errors.append(f"{where}: callable = {callable_} without module = or wsgi-file =; "
                      "name the module")
    return Translation(values, warnings, errors)


_MAGIC = re.compile(r"%([^(])")
_ENV = re.compile(r"\$\(([^)]*)\)")
_REFERENCE = re.compile(r"%\(([^)]*)\)")
_AT = re.compile(r"@\(([^)]*)\)")
#: how deep %(name) references may nest (uWSGI loops forever on a cycle)
REFERENCE_DEPTH = 16


def _substitute(pattern, value, lookup, problems, unknown):
    """`value` with each match of `pattern` replaced by lookup(its group), or
    left as it is and a problem noted (`unknown` formats it) if None."""
    def replace(match):
        found = lookup(match.group(1))
        if found is None:
            if unknown:
                problems.append(unknown.format(match.group(1)) if isinstance(unknown, str)
                                else unknown(match.group(1)))
            return match.group(0)
        return found
    return pattern.sub(replace, value)


def _magic_unknown(letter):
    if not (letter.isalnum() or letter in "[*"):
        return None
    return (f"the placeholder %{letter} is not supported by forkserve (supported: "
            f"{', '.join('%' + k for k in PLACEHOLDERS)}, %(name), $(ENV))")


def _getenv(name, environ):
    """$(NAME), $(NAME:-DEFAULT) (unset or empty) and $(NAME-DEFAULT) (unset), as uWSGI."""
    if ":-" in name:
        name, _, default = name.partition(":-")
        return environ.get(name) or default
    if "-" in name:
        name, _, default = name.partition("-")
        return environ.get(name, default)
    return environ.get(name)


def _references(value, defined, problems):
    """%(name) resolved from `defined`, nested references too; @(...) refused."""
    for _ in range(REFERENCE_DEPTH):
        expanded = _substitute(_REFERENCE, value, defined.get, [], None)
        if expanded == value:
            break
        value = expanded
    else:
        problems.append(f"%() references nest deeper than {REFERENCE_DEPTH} (a cycle?)")
    for name in _REFERENCE.findall(value):
        problems.append(f"%({name}) names no option, variable or placeholder of the file")
    for name in _AT.findall(value):
        problems.append(f"@({name}): reading values from files or commands is not supported; "
                        "write the value")
    return value


#: the apply functions of the options that are switches (--master, no value)
_SWITCH_APPLIES = (_switch_on, _master, _die_on_term)
#: warned options uWSGI takes as switches
_WARNED_SWITCHES = frozenset({
    "enable-threads", "thunder-lock", "single-interpreter", "lazy-apps", "lazy", "log-4xx",
    "log-5xx", "log-zero", "log-sendfile", "log-ioerror", "log-master", "log-reopen",
    "log-date", "logdate", "log-micros", "honour-stdin", "so-keepalive", "reuse-port",
    "stats-http", "memory-report", "harakiri-verbose", "http-keepalive"})


def is_switch(option):
    """True if uWSGI's command line takes the option without a value."""
    return option.apply in _SWITCH_APPLIES or option.name in _WARNED_SWITCHES


def split_flags(argv, taken):
    """(the other arguments, [(name, value)]): the uWSGI options in `argv`
    that are not forkserve's own flags (`taken`), written as uWSGI's command
    line takes them: --name VALUE, --name=VALUE, or a switch (--master),
    which may be followed by true or false. Long options only: uWSGI's
    one-letter ones (-s, -p, -w...) mean other things to forkserve."""
    rest, pairs = [], []
    index = 0
    while index < len(argv):
        argument = argv[index]
        index += 1
        if argument == "--":
            rest += argv[index - 1:]
            break
        flag, equals, value = argument.partition("=")
        option = BY_NAME.get(flag[2:]) if flag.startswith("--") and len(flag) > 3 else None
        if option is None or flag in taken:
            rest.append(argument)
            continue
        following = argv[index] if index < len(argv) else None
        if equals:
            pass
        elif is_switch(option):
            value = "true"
            if following is not None and following.lower() in _TRUE[1:] + _FALSE:
                value, index = following, index + 1
        elif following is not None and not following.startswith("--"):
            value, index = following, index + 1
        pairs.append((flag[2:], value))
    return rest, pairs


def table():
    """docs/uwsgi.md's option table, in Markdown."""
    lines = ["| uWSGI option | forkserve | What happens |", "|---|---|---|"]
    for option in OPTIONS:
        names = ", ".join(f"`{name}`" for name in (option.name, *option.aliases))
        shown = ", ".join(str(value).lower() for value in option.harmless)
        note = f"{option.note} Silent for {shown}." if shown else option.note
        lines.append(f"| {names} | {option.kind} | {note} |")
    return "\n".join(lines)


def counts():
    """{kind: (rows, names)}: the table's rows of each kind, and the option
    names they cover (aliases included)."""
    result = {}
    for option in OPTIONS:
        rows, names = result.get(option.kind, (0, 0))
        result[option.kind] = (rows + 1, names + 1 + len(option.aliases))
    return result


def summary():
    """docs/uwsgi.md's one-line count of the table."""
    found = counts()
    kinds = ", ".join(f"{found[kind][0]} {kind} ({found[kind][1]} names)"
                      for kind in ("honoured", "mapped", "warned", "refused"))
    return (f"{len(OPTIONS)} rows covering {sum(n for _, n in found.values())} option names "
            f"(aliases included): {kinds}.")


if __name__ == "__main__":  # python -m forkserve.config.uwsgi prints docs/uwsgi.md's table
    print(summary() + "\n\n" + table())
