"""Setting values: text (from the command line, the environment or a config
file) in, a typed value out, or a ConfigError that says what to write instead.

forkserve.config.settings declares which setting uses which converter.
"""

import os
from typing import Any, Callable

__all__ = [
    "ConfigError", "Findings", "allowed_addresses", "bind_list", "cpu_affinity", "cpu_count",
    "default_workers", "env_list", "flag", "json_mapping", "log_format", "log_level", "mapping",
    "name_or_id", "path_list", "proxy_protocol", "reload_engine", "scheme_headers", "seconds",
    "text", "umask", "whole", "one_of"]


class ConfigError(Exception):
    """A setting has a value forkserve cannot use. The message says which and why
    (one line per problem); `warnings` are the settings found, in the same pass,
    that would have no effect."""

    def __init__(self, message, warnings=()):
        super().__init__(message)
        self.warnings = list(warnings)


class Findings:
    """What reading the settings found, all of it in one pass: `errors` stop the
    server from starting, `warnings` name settings that would have no effect."""

    def __init__(self):
        self.errors, self.warnings = [], []

    def check(self):
        """Raise one ConfigError naming every error, carrying the warnings."""
        if self.errors:
            raise ConfigError("\n".join(self.errors), self.warnings)


def one_of(value, candidates) -> bool:
    """Whether a Gunicorn or uWSGI value (typed, or as a config file spells
    it) is one of `candidates`: a value that asks for what forkserve does
    anyway, so that neither side warns about it (one rule for both)."""
    for candidate in candidates:
        if isinstance(candidate, bool) or candidate is None:
            text = str(value).strip().lower() if isinstance(value, str) else value
            if candidate is None and value in (None, "", "none"):
                return True
            if isinstance(candidate, bool) and text in ((True, "1", "true", "yes", "on")
                                                        if candidate else
                                                        (False, "0", "false", "no", "off")):
                return True
        elif isinstance(candidate, int) and not isinstance(value, bool):
            if isinstance(value, int):  # an IntEnum such as ssl.CERT_NONE too
                if int(value) == candidate:
                    return True
                continue
            try:
                if int(str(value).strip()) == candidate:
                    return True
            except ValueError:
                pass
        elif candidate == value or (isinstance(value, str) and candidate == value.strip()):
            return True
    return False


# --- value converters: text (or a config-file value) in, a typed value out ---

def whole(minimum: int) -> Callable[[Any], int]:
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


def seconds(value) -> float:
    try:
        number = float(str(value).strip())
    except ValueError:
        raise ValueError(f"expected a number of seconds, got {value!r}") from None
    if number < 0 or number != number:
        raise ValueError(f"expected a number of seconds >= 0, got {value!r}")
    return number


seconds.__name__ = "float"


def text(value) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"expected a non-empty string, got {value!r}")
    return value


text.__name__ = "str"


def flag(value) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"expected true or false, got {value!r}")


flag.__name__ = "bool"


def flag_on_by_default(value) -> bool:
    """A switch that is on unless turned off; None (Gunicorn's "the
    default") means on."""
    return True if value is None else flag(value)


flag_on_by_default.__name__ = "bool"


def auto_flag(value):
    """True, False, or None for "auto" (the default decides)."""
    if value is None or (isinstance(value, str) and value.strip().lower() == "auto"):
        return None
    return flag(value)


auto_flag.__name__ = "bool"


def bind_list(value) -> list:
    items = value if isinstance(value, (list, tuple)) else str(value).split(",")
    addresses = [str(item).strip() for item in items if str(item).strip()]
    if not addresses:
        raise ValueError("expected at least one address such as 127.0.0.1:8000")
    return addresses


bind_list.__name__ = "list"


def log_level(value) -> str:
    level = str(value).strip().lower()
    if level not in ("debug", "info", "warning", "error", "critical"):
        raise ValueError(f"expected one of debug, info, warning, error, critical; got {value!r}")
    return level


log_level.__name__ = "str"


# --- converters for the settings Gunicorn users bring (forkserve.config.gunicorn) ---

def env_list(value) -> list:
    items = value if isinstance(value, (list, tuple)) else [value]
    pairs = []
    for item in items:
        key, sep, _ = str(item).partition("=")
        if not sep or not key.strip():
            raise ValueError(f"expected KEY=VALUE, got {item!r}")
        pairs.append(str(item))
    return pairs


env_list.__name__ = "list"


def umask(value) -> int:
    try:
        number = value if isinstance(value, int) and not isinstance(value, bool) else int(
            str(value).strip(), 0)
    except ValueError:
        raise ValueError(f"expected a umask such as 0o022 or 18, got {value!r}") from None
    if not 0 <= number <= 0o777:
        raise ValueError(f"expected a umask between 0 and 0o777, got {value!r}")
    return number


umask.__name__ = "int"


def allowed_addresses(value) -> list:
    import ipaddress
    items = value if isinstance(value, (list, tuple)) else str(value).split(",")
    addresses = [str(item).strip() for item in items if str(item).strip()]
    for address in addresses:
        if address != "*":
            try:
                ipaddress.ip_network(address, strict=False)
            except ValueError:
                raise ValueError(f"{address!r} is not an IP address, a network like "
                                 "10.0.0.0/8, or '*'") from None
    return addresses


allowed_addresses.__name__ = "list"


def mapping(value) -> dict:
    """A dict, JSON text, or HEADER=value,HEADER=value text."""
    if isinstance(value, dict):
        return dict(value)
    text = str(value).strip()
    if text.startswith("{"):
        import json
        try:
            loaded = json.loads(text)
        except ValueError as exc:
            raise ValueError(f"not valid JSON: {exc}") from None
        if isinstance(loaded, dict):
            return loaded
    pairs = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, val = item.partition("=")
        if not sep:
            raise ValueError(f"expected a dict, JSON or NAME=value,NAME=value; got {value!r}")
        pairs[key.strip()] = val.strip()
    return pairs


mapping.__name__ = "dict"


def json_mapping(value) -> dict:
    """A dict that survives JSON: a reload hands the settings over as JSON."""
    result = mapping(value)
    import json
    try:
        json.dumps(result)
    except (TypeError, ValueError):
        raise ValueError("must hold only strings, numbers, lists and dicts (name classes and "
                         "functions by dotted path, as in '()': 'package.module.factory')"
                         ) from None
    return result


json_mapping.__name__ = "dict"


def scheme_headers(value) -> dict:
    return {str(name).upper(): str(val) for name, val in mapping(value).items()}


scheme_headers.__name__ = "dict"


class _AnyAtom(dict):
    def __missing__(self, key):
        return "-"


def log_format(value) -> str:
    form = text(value)
    try:
        form % _AnyAtom()
    except (ValueError, TypeError) as exc:
        raise ValueError(f"not a %-format with atoms like %(h)s: {exc}") from None
    return form


log_format.__name__ = "str"


def path_list(value) -> list:
    items = value if isinstance(value, (list, tuple)) else [value]
    return [text(item) for item in items]


path_list.__name__ = "list"


def url_path_list(value) -> list:
    """URL paths; a string holds several separated by spaces (no path has one)."""
    items = value if isinstance(value, (list, tuple)) else str(value).split()
    paths = [text(item) for item in items]
    for path in paths:
        if not path.startswith("/"):
            raise ValueError(f"{path!r} is not a URL path; give one that starts with /, "
                             "such as /health or /products?page=2")
    return paths


url_path_list.__name__ = "list"


def reload_engine(value) -> str:
    engine = str(value).strip().lower()
    if engine not in ("auto", "poll"):
        raise ValueError(f"forkserve polls for changes; use auto or poll, not {value!r}")
    return engine


reload_engine.__name__ = "str"


def protocol(value) -> str:
    name = str(value).strip().lower()
    if name not in ("http", "uwsgi"):
        raise ValueError(f"expected http or uwsgi; got {value!r}")
    return name


protocol.__name__ = "str"


def proxy_protocol(value) -> str:
    if value is True:
        return "auto"
    if value is False or value is None:
        return "off"
    mode = str(value).strip().lower()
    if mode not in ("off", "v1", "v2", "auto"):
        raise ValueError(f"expected off, v1, v2 or auto; got {value!r}")
    return mode


proxy_protocol.__name__ = "str"


def cpu_affinity(value) -> str:
    """auto, on or off; a config file's True / False mean on / off."""
    if value is True:
        return "on"
    if value is False:
        return "off"
    if value is None:
        return "auto"
    mode = str(value).strip().lower()
    if mode not in ("auto", "on", "off"):
        raise ValueError(f"expected auto, on or off; got {value!r}")
    return mode


cpu_affinity.__name__ = "str"


def cpu_count() -> int:
    return len(os.sched_getaffinity(0)) or 1


def default_workers() -> int:
    """WEB_CONCURRENCY when set (as Gunicorn and Heroku), else the CPU count."""
    try:
        return whole(0)(os.environ["WEB_CONCURRENCY"])
    except (KeyError, ValueError):
        return cpu_count()


def name_or_id(value) -> str:
    """A user or group: a name, or a number (Gunicorn config files use both)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return text(value)


name_or_id.__name__ = "str"


def optional_text(value) -> str:
    """A string that may be empty (statsd_prefix, dogstatsd_tags)."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ValueError(f"expected a string, got {value!r}")
    return value.strip()


optional_text.__name__ = "str"


def statsd_address(value) -> str:
    """statsd_host: HOST:PORT, [IPV6]:PORT or unix://PATH (checked, kept as given)."""
    from forkserve.statsd import parse_address
    parse_address(text(value))
    return value.strip()


statsd_address.__name__ = "str"


def syslog_address(value) -> str:
    """syslog_addr: udp://HOST:PORT, tcp://HOST:PORT or unix://PATH[#dgram|#stream]."""
    from forkserve.logs import parse_syslog_address
    parse_syslog_address(text(value))
    return value.strip()


syslog_address.__name__ = "str"


def syslog_facility(value) -> str:
    from logging.handlers import SysLogHandler
    name = str(value).strip().lower()
    if name not in SysLogHandler.facility_names:
        raise ValueError(f"expected a syslog facility such as user, daemon or local0..local7; "
                         f"got {value!r}")
    return name


syslog_facility.__name__ = "str"


def cert_reqs(value) -> int:
    """cert_reqs: 0 (no client certificate), 1 (checked if sent), 2 (required);
    ssl.CERT_NONE, CERT_OPTIONAL and CERT_REQUIRED are these numbers."""
    try:
        number = int(value) if not isinstance(value, str) else int(value.strip())
    except (TypeError, ValueError):
        number = None
    if isinstance(value, bool) or number not in (0, 1, 2):
        raise ValueError(f"expected 0 (none), 1 (optional) or 2 (required), got {value!r}")
    return number


cert_reqs.__name__ = "int"
