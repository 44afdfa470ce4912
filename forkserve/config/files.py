"""Config files: a Python file (module-level names, as gunicorn.conf.py),
a TOML file (its [tool.forkserve] table, or the whole file) or a uWSGI ini
file (its [uwsgi] section, forkserve.config.uwsgi), read into
{setting name: raw value} with the file's hooks under "hooks".

Which names are settings, and what a Gunicorn or uWSGI name means, is
decided by forkserve.config.gunicorn and forkserve.config.uwsgi;
forkserve.config.settings converts the values.
"""

import os
import runpy
import tomllib

from forkserve.config import gunicorn, uwsgi
from forkserve.config.values import ConfigError

__all__ = ["read_config_file"]


def read_config_file(path: str, known, findings, *, ini=False, environ=None) -> dict:
    """Read a config file into {setting name: raw value}, `known` being the
    setting names. `ini`: read it as a uWSGI ini (--ini), PATH:SECTION allowed.
    Raises ConfigError when the file cannot be read at all; the settings'
    errors and warnings go to `findings`."""
    section = "uwsgi"
    if ini and not os.path.isfile(path) and ":" in path:
        path, section = path.rsplit(":", 1)
    if not os.path.isfile(path):
        raise ConfigError(f"config file {path!r} does not exist; check the path given to "
                          f"{'--ini' if ini else '-c'}")
    if ini or path.endswith(".ini") or _starts_uwsgi_section(path):
        return _uwsgi_ini(path, section, os.environ if environ is None else environ, findings)
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
        return _known_keys(table, path, known, findings, python=False)
    try:
        namespace = runpy.run_path(path, run_name="__forkserve_config__")
    except SystemExit:
        raise ConfigError(f"config file {path} called exit() while being read") from None
    except Exception as exc:
        raise ConfigError(f"config file {path} raised {type(exc).__name__}: {exc}") from None
    return _known_keys(namespace, path, known, findings, python=True)


def _starts_uwsgi_section(path):
    with open(path, "rb") as handle:
        start = handle.read(4096)
    return uwsgi.looks_like_uwsgi_ini(start.decode("utf-8", "replace"))


def _uwsgi_ini(path, section, environ, findings):
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {path}: cannot read it: {exc}") from None
    result = uwsgi.translate(text, path, environ, section)
    findings.errors += result.errors  # each names the file, the line and what to do
    findings.warnings += result.warnings
    return {**result.values, "hooks": {}}


def _known_keys(table: dict, path: str, known, findings, *, python: bool) -> dict:
    """{setting: raw value}, with the file's hooks under the key "hooks"."""
    values, hooks = gunicorn.settings_from_file(table, known, path, findings, python=python)
    values["hooks"] = hooks
    return values
