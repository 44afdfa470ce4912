"""Settings a Gunicorn user expects the master to apply before the
application loads: raw_env (environment variables) and pythonpath (import
directories), applied once in the master so every worker inherits them; and
umask, which (as in Gunicorn) applies while the listening sockets are bound,
so it sets the mode of unix sockets and nothing else.
"""

import contextlib
import os
import sys

__all__ = ["apply", "environment_pairs", "umask"]


def environment_pairs(raw_env) -> dict:
    """["KEY=VALUE", ...] -> {KEY: VALUE}; the value may itself contain '='."""
    pairs = {}
    for item in raw_env or ():
        key, _, value = item.partition("=")
        pairs[key.strip()] = value
    return pairs


def apply(cfg):
    os.environ.update(environment_pairs(cfg.raw_env))
    if cfg.pythonpath:
        directories = [path.strip() for path in cfg.pythonpath.split(",") if path.strip()]
        for directory in reversed(directories):
            directory = os.path.abspath(directory)
            if directory not in sys.path:
                sys.path.insert(0, directory)


@contextlib.contextmanager
def umask(mask):
    """The process's umask is `mask` inside the block, restored after it."""
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)
