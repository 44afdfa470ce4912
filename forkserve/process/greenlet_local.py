"""threading.local per greenlet, in C, in place of gevent's.

gevent's monkey-patching makes threading.local (and _thread._local,
_threading_local.local) gevent.local.local: one namespace per greenlet,
as it must be where every connection is a greenlet. That class costs
about 80 ns an attribute read where CPython's thread local costs 30, and
frameworks read their request context from such locals many times a
request: Bottle's `request` and `response` are, and PersonDB's Bottle
app took 15.0-15.7 µs a call under patch_all() against 12.9-13.3 with
this local and 13.0-13.1 with CPython's own (one process, 30,000 calls;
benchmarks/results/throughput/instructions.md).

`install` puts forkserve's local (_greenlet_local.c: a dict per greenlet,
made the object's own for each attribute access, and only for it) where
gevent put its own, so the application's imports see it. It is a switch
(--no-c-local), and where it does not apply (the C extension not built or
turned off by FORKSERVE_NO_C, greenlet's C API not what it checked at
import, gevent not patched) nothing changes and the log says why.

Invariants:
- Called after gevent.monkey.patch_all() and before the application is
  imported: a local made earlier keeps gevent's type, which stays correct.
- A name is replaced only while it holds gevent's local: what the user or
  another library put there is left alone.
- The C local behaves as threading.local does per thread, per greenlet:
  attributes, __dict__, a subclass's __init__ run again with the same
  arguments in each greenlet that first touches it, __slots__ shared; a
  greenlet's attributes go when it finishes (a gevent Greenlet, as with
  gevent's local: they may lead back to it) or is freed, also for a local a
  finaliser kept after the collector found it in a cycle; what bypasses the
  local's lookup (object.__getattribute__) finds no greenlet's attributes
  (tests/test_greenlet_local.py runs the same checks on gevent's and on
  this).
"""

import logging
import sys

from forkserve import cext

__all__ = ["NAMES", "install", "c_local"]

log = logging.getLogger("forkserve")

#: Where gevent's patch_thread() puts its local: (module, attribute).
NAMES = (("threading", "local"), ("_thread", "_local"), ("_threading_local", "local"))


def c_local():
    """(forkserve's C local type, None), or (None, why it is not used)."""
    module, why_not = cext.c_extension_or_why("forkserve.process._greenlet_local")
    return (module.local, None) if module is not None else (None, why_not)


def install(enabled):
    """Put the C local where gevent's is (see the module's docstring);
    returns the names replaced, and logs what was done or why not."""
    if not enabled:
        log.debug("threading.local: gevent's (--no-c-local)")
        return []
    local, why_not = c_local()
    if local is None:
        log.debug("threading.local: gevent's (%s)", why_not)
        return []
    import gevent.local
    replaced = []
    for module_name, name in NAMES:
        module = sys.modules.get(module_name)
        if module is not None and getattr(module, name, None) is gevent.local.local:
            setattr(module, name, local)
            replaced.append(f"{module_name}.{name}")
    if replaced:
        log.debug("threading.local: forkserve's C local, one namespace per greenlet, in %s "
                 "(--no-c-local keeps gevent's)", ", ".join(replaced))
    else:
        log.debug("threading.local: left as it is (gevent did not patch it)")
    return replaced
