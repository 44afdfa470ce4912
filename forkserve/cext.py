"""Which of forkserve's optional C extensions are used.

Each extension (forkserve/memory/_immortal.c, _whywalk.c, _free_space.c,
forkserve/http/_h1.c and _h1_connection.c) is the fast path of Python code that remains;
forkserve/process/_greenlet_local.c stands in for gevent's own local,
which remains. They are built only where a compiler is present (setup.py
marks them optional). One
switch turns them all off: FORKSERVE_NO_C set to a non-empty value, read
where an extension is looked up, so tests and a user chasing a bug can run
the pure-Python code on a tree that has them built.
"""

import importlib
import os

__all__ = ["NO_C_ENV", "c_extension", "c_extension_or_why"]

#: Set to a non-empty value to ignore the C extensions (tests, debugging).
NO_C_ENV = "FORKSERVE_NO_C"


def c_extension(module):
    """The C extension `module` (a dotted name), or None where it did not
    build or FORKSERVE_NO_C is set (then the pure-Python code runs)."""
    return c_extension_or_why(module)[0]


def c_extension_or_why(module):
    """(the C extension `module`, None), or (None, why it is not used), for
    a log line."""
    if os.environ.get(NO_C_ENV):
        return None, f"{NO_C_ENV} is set"
    try:
        return importlib.import_module(module), None
    except ImportError as exc:  # not built, or its own checks refused at import
        return None, f"{module} did not import: {exc}"
