"""The effective settings, as `forkserve --print-config` prints them.

Pure: a Config in, text out: one `name = value` line per setting (the
config-file key and the converted value), each with a comment naming where
the value came from: default, which config file, FORKSERVE_CMD_ARGS, an
environment variable, or the command line.
"""

import forkserve
from forkserve.config import values
from forkserve.config.settings import SETTINGS

__all__ = ["render"]


def render(cfg) -> str:
    lines = [f"# forkserve {forkserve.__version__}: the settings in force and where each came from",
             _line("app", repr(cfg.app), cfg.sources.get("app", "not given"))]
    for setting in SETTINGS:
        if setting.name == "print_config":
            continue  # it asked for this printout; it is not a setting of the server
        value = cfg.values.get(setting.name)
        shown = _octal(value) if setting.convert is values.umask else repr(value)
        lines.append(_line(setting.name, shown, cfg.sources.get(setting.name, "default")))
    if cfg.hooks:
        lines.append(f"# server hooks defined in {cfg.values.get('config')}: "
                     + ", ".join(sorted(cfg.hooks)))
    return "\n".join(lines)


def _octal(mask):
    """A mode mask as it is written: 0o022, not 18."""
    return f"0o{mask:03o}" if isinstance(mask, int) else repr(mask)


def _line(name, shown, source) -> str:
    assignment = f"{name} = {shown}"
    return f"{assignment:<44}  # {source}"
