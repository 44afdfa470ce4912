"""Every setting forkserve has, declared once.

Each `Setting` names its command-line flags, its environment variable
(FORKSERVE_<NAME>), its config-file key (the name), its type, its default
and one line of help. The argument parser, the environment and config-file
readers and the README's settings table are all derived from `SETTINGS`;
nothing else in the package lists settings.

Precedence, lowest first: defaults, config file, environment, command line.

This module only decides: it parses text into a `Config` and raises
`ConfigError` with a message that says what to do. It reads no files except
the config file it is asked to read.
"""

import argparse
import dataclasses
import os
import runpy
import sys
import tomllib
from typing import Any, Callable

__all__ = ["Setting", "SETTINGS", "Config", "ConfigError", "parse", "settings_table"]


class ConfigError(Exception):
    """A setting has a value forkserve cannot use. The message says which and why."""


# --- value converters: text (or a config-file value) in, a typed value out ---

def _whole(minimum: int) -> Callable[[Any], int]:
    def convert(value):
        if isinstance(value, bool):
            raise ValueError(f"expected a whole number >= {minimum}, got {value!r}")
        try:
            number = int(str(value).strip())
        except ValueError:
            raise ValueError(f"expected a whole number >= {minimum}, got {value!r}") from None
        if number < minimum:
            raise ValueError(f"expected a whole number >= {minimum}, got {number}")
        return number
    convert.__name__ = "int"
    return convert


def _seconds(value) -> float:
    try:
        number = float(str(value).strip())
    except ValueError:
        raise ValueError(f"expected a number of seconds, got {value!r}") from None
    if number < 0 or number != number:
        raise ValueError(f"expected a number of seconds >= 0, got {value!r}")
    return number


_seconds.__name__ = "float"


def _text(value) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"expected a non-empty string, got {value!r}")
    return value


_text.__name__ = "str"


def _flag(value) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"expected true or false, got {value!r}")


_flag.__name__ = "bool"


def _bind_list(value) -> list:
    items = value if isinstance(value, (list, tuple)) else str(value).split(",")
    addresses = [str(item).strip() for item in items if str(item).strip()]
    if not addresses:
        raise ValueError("expected at least one address such as 127.0.0.1:8000")
    return addresses


_bind_list.__name__ = "list"


def _log_level(value) -> str:
    level = str(value).strip().lower()
    if level not in ("debug", "info", "warning", "error", "critical"):
        raise ValueError(f"expected one of debug, info, warning, error, critical; got {value!r}")
    return level


_log_level.__name__ = "str"


def _cpu_count() -> int:
    return len(os.sched_getaffinity(0)) or 1


@dataclasses.dataclass(frozen=True)
class Setting:
    name: str
    flags: tuple
    convert: Callable[[Any], Any]
    default: Any
    help: str
    metavar: str | None = None
    # "value" takes an argument; "flag" is a switch; "append" repeats.
    kind: str = "value"
    section: str = "server"

    @property
    def env(self) -> str:
        return "FORKSERVE_" + self.name.upper()

    def default_value(self):
        return self.default() if callable(self.default) else self.default

    def shown_default(self) -> str:
        if self.name == "workers":
            return "number of CPUs"
        value = self.default_value()
        if value is None:
            return "(none)"
        if isinstance(value, list):
            return ",".join(value)
        if isinstance(value, bool):
            return "off" if not value else "on"
        return str(value)


SETTINGS = (
    Setting("bind", ("-b", "--bind"), _bind_list, lambda: ["127.0.0.1:8000"],
            "Address to listen on: HOST:PORT, [IPv6]:PORT or unix:PATH. Repeat for several; "
            "port 0 picks a free port (the real one is logged).",
            metavar="ADDRESS", kind="append"),
    Setting("workers", ("-w", "--workers"), _whole(0), _cpu_count,
            "Number of forked worker processes. 0 serves from one process with no fork.",
            metavar="N"),
    Setting("worker_connections", ("--worker-connections",), _whole(1), 1000,
            "Most simultaneous connections one worker serves (one greenlet each).",
            metavar="N"),
    Setting("backlog", ("--backlog",), _whole(1), 2048,
            "Listen queue length: connections the kernel holds while workers are busy.",
            metavar="N"),
    Setting("timeout", ("--timeout",), _seconds, 30.0,
            "A worker whose event loop is blocked this many seconds is killed and replaced. "
            "0 disables.", metavar="SECONDS"),
    Setting("graceful_timeout", ("--graceful-timeout",), _seconds, 30.0,
            "How long in-flight requests may run after a graceful stop or restart.",
            metavar="SECONDS"),
    Setting("keep_alive", ("--keep-alive",), _seconds, 5.0,
            "Seconds an idle keep-alive connection is kept open. 0 closes after each response.",
            metavar="SECONDS", section="http"),
    Setting("max_requests", ("--max-requests",), _whole(0), 0,
            "Recycle a worker gracefully after it has served this many requests. 0 disables.",
            metavar="N"),
    Setting("max_requests_jitter", ("--max-requests-jitter",), _whole(0), 0,
            "Add a random 0..N to each worker's --max-requests so they do not recycle together.",
            metavar="N"),
    Setting("pid", ("--pid",), _text, None,
            "Write the master's PID to this file (removed on exit).", metavar="FILE"),
    Setting("name", ("-n", "--name"), _text, None,
            "Prefix for process titles, e.g. 'persondb' gives 'persondb: worker 1 [app]'.",
            metavar="NAME"),
    Setting("access_logfile", ("--access-logfile",), _text, None,
            "Write an access log line per request to FILE ('-' for stdout). Off by default.",
            metavar="FILE", section="logging"),
    Setting("error_logfile", ("--error-logfile",), _text, "-",
            "Write the server log to FILE ('-' for stderr).", metavar="FILE", section="logging"),
    Setting("log_level", ("--log-level",), _log_level, "info",
            "Server log level: debug, info, warning, error or critical.", metavar="LEVEL",
            section="logging"),
    Setting("config", ("-c", "--config"), _text, None,
            "Read settings from FILE: a Python file (like gunicorn.conf.py) or a TOML file "
            "(its [tool.forkserve] table, or the whole file). ./forkserve.conf.py is read "
            "when present and no -c is given.", metavar="FILE"),
    Setting("check_config", ("--check-config",), _flag, False,
            "Check the settings and load the application, then exit (0 if all is well).",
            kind="flag"),
    Setting("no_monkey_patch", ("--no-monkey-patch",), _flag, False,
            "Do not call gevent.monkey.patch_all() before loading the application.",
            kind="flag"),
    Setting("chdir", ("--chdir",), _text, None,
            "Change to this directory before loading the application.", metavar="DIR"),
    Setting("stats", ("--stats",), _text, None,
            "Serve memory figures from the master at this address (HOST:PORT or unix:PATH): "
            "JSON at / and Prometheus text at /metrics.", metavar="ADDRESS", section="memory"),
    Setting("memory_log_interval", ("--memory-log-interval",), _seconds, 0.0,
            "Log every process's shared and private memory every this many seconds. 0 disables.",
            metavar="SECONDS", section="memory"),
    Setting("max_worker_memory", ("--max-worker-memory",), _whole(0), 0,
            "Recycle a worker gracefully when its private memory (USS, not RSS) exceeds this "
            "many MiB. 0 disables.", metavar="MB", section="memory"),
    Setting("limit_request_line", ("--limit-request-line",), _whole(0), 4094,
            "Longest request line in bytes; longer gets 414. 0 means the built-in maximum (65536).",
            metavar="BYTES", section="http"),
    Setting("limit_request_fields", ("--limit-request-fields",), _whole(0), 100,
            "Most header fields in a request; more gets 431. 0 means the built-in maximum (32768).",
            metavar="N", section="http"),
    Setting("limit_request_field_size", ("--limit-request-field_size", "--limit-request-field-size"),
            _whole(0), 8190,
            "Largest header field in bytes; larger gets 431. 0 means the built-in maximum (65536).",
            metavar="BYTES", section="http"),
    Setting("limit_request_body", ("--limit-request-body",), _whole(0), 0,
            "Largest request body in bytes; larger gets 413. 0 means no limit.",
            metavar="BYTES", section="http"),
    Setting("header_timeout", ("--header-timeout",), _seconds, 10.0,
            "Seconds a client has to send the request line and headers.",
            metavar="SECONDS", section="http"),
    Setting("user", ("-u", "--user"), _text, None,
            "Switch workers to this user (name or uid) after the sockets are bound.",
            metavar="USER", section="security"),
    Setting("group", ("-g", "--group"), _text, None,
            "Switch workers to this group (name or gid) after the sockets are bound.",
            metavar="GROUP", section="security"),
)

BY_NAME = {setting.name: setting for setting in SETTINGS}


@dataclasses.dataclass
class Config:
    """The settings in force, plus the application spec. Built by `parse`."""
    app: str | None = None
    values: dict = dataclasses.field(default_factory=dict)
    sources: dict = dataclasses.field(default_factory=dict)

    def __getattr__(self, name):
        try:
            return self.__dict__["values"][name]
        except KeyError:
            raise AttributeError(name) from None

    def with_values(self, **changes) -> "Config":
        values = dict(self.values)
        for name, raw in changes.items():
            values[name] = _convert(BY_NAME[name], raw, "argument")
        return Config(app=self.app, values=values, sources=dict(self.sources))


def _convert(setting: Setting, raw, where: str):
    try:
        return setting.convert(raw)
    except ValueError as exc:
        flag = setting.flags[-1]
        raise ConfigError(f"{where}: {flag} ({setting.name}): {exc}") from None


def build_parser(prog: str = "forkserve") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        usage=f"{prog} [OPTIONS] MODULE:APP\n       {prog} memory [--pid FILE | --stats ADDRESS] [--json] [--watch SECONDS]",
        description="Pre-fork gevent WSGI server whose workers share the master's preloaded data.",
        epilog="Every option can also be set in a config file (-c) by its name, or in the "
               "environment as FORKSERVE_<NAME>, e.g. FORKSERVE_WORKERS=4.",
    )
    parser.add_argument("app", nargs="?", metavar="MODULE:APP",
                        help="The WSGI application: module:attribute, or module:factory() to "
                             "call a factory (literal arguments allowed).")
    parser.add_argument("--version", action="version",
                        version="forkserve " + __import__("forkserve").__version__)
    for setting in SETTINGS:
        dest = setting.name
        if setting.kind == "flag":
            parser.add_argument(*setting.flags, dest=dest, action="store_const", const=True,
                                default=None, help=setting.help)
        elif setting.kind == "append":
            parser.add_argument(*setting.flags, dest=dest, action="append", default=None,
                                metavar=setting.metavar, help=setting.help)
        else:
            parser.add_argument(*setting.flags, dest=dest, default=None,
                                metavar=setting.metavar, help=setting.help)
    return parser


def read_config_file(path: str) -> dict:
    """Read a config file into {setting name: raw value}. Raises ConfigError."""
    if not os.path.isfile(path):
        raise ConfigError(f"config file {path!r} does not exist; check the path given to -c")
    if path.endswith(".toml"):
        try:
            with open(path, "rb") as handle:
                document = tomllib.load(handle)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {path}: not valid TOML: {exc}") from None
        table = document.get("tool", {}).get("forkserve")
        if table is None:
            if os.path.basename(path) == "pyproject.toml":
                raise ConfigError(f"config file {path} has no [tool.forkserve] table; add one")
            table = document
        return _known_keys(table, path, strict=True)
    try:
        namespace = runpy.run_path(path, run_name="__forkserve_config__")
    except SystemExit:
        raise ConfigError(f"config file {path} called exit() while being read") from None
    except Exception as exc:
        raise ConfigError(f"config file {path} raised {type(exc).__name__}: {exc}") from None
    return _known_keys(namespace, path, strict=False)


def _known_keys(table: dict, path: str, *, strict: bool) -> dict:
    values = {}
    for key, value in table.items():
        name = key.replace("-", "_")
        if name == "app" or name == "wsgi_app":
            values["app"] = value
        elif name in BY_NAME:
            values[name] = value
        elif strict:
            import difflib
            close = difflib.get_close_matches(name, BY_NAME, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"config file {path}: unknown setting {key!r}{hint}")
    return values


def parse(argv, environ=None, cwd=None) -> Config:
    """Turn command-line arguments, environment and config file into a Config."""
    environ = os.environ if environ is None else environ
    cwd = os.getcwd() if cwd is None else cwd
    parser = build_parser()
    args = parser.parse_args(argv)
    cli = {name: value for name, value in vars(args).items() if value is not None}

    config_path = cli.get("config") or environ.get("FORKSERVE_CONFIG")
    if config_path is None and os.path.isfile(os.path.join(cwd, "forkserve.conf.py")):
        config_path = os.path.join(cwd, "forkserve.conf.py")
    file_values = read_config_file(config_path) if config_path else {}

    values, sources = {}, {}
    for setting in SETTINGS:
        if setting.name in cli:
            raw, source = cli[setting.name], "command line"
        elif setting.env in environ:
            raw, source = environ[setting.env], f"environment {setting.env}"
        elif setting.name in file_values:
            raw, source = file_values[setting.name], f"config file {config_path}"
        else:
            values[setting.name] = setting.default_value()
            sources[setting.name] = "default"
            continue
        values[setting.name] = _convert(setting, raw, source)
        sources[setting.name] = source
    if config_path:
        values["config"] = config_path

    app = cli.get("app") or environ.get("FORKSERVE_APP") or file_values.get("app")
    return Config(app=app, values=values, sources=sources)


def settings_table() -> str:
    """The README's settings tables, one per section, in Markdown."""
    sections = dict.fromkeys(setting.section for setting in SETTINGS)  # in declared order
    lines = []
    for section in sections:
        title = "HTTP" if section == "http" else section.capitalize()
        lines += ["" if lines else None, f"**{title}**", "",
                  "| Setting (config key) | Flag | Environment | Default | What it does |",
                  "|---|---|---|---|---|"]
        for setting in (s for s in SETTINGS if s.section == section):
            flag = " / ".join(f"`{flag}`" for flag in setting.flags
                              if not flag.endswith("_size"))
            lines.append(f"| `{setting.name}` | {flag} | `{setting.env}` "
                         f"| {setting.shown_default()} | {setting.help} |")
    return "\n".join(line for line in lines if line is not None)


if __name__ == "__main__":  # python -m forkserve.config.settings prints the README table
    sys.stdout.write(settings_table() + "\n")
