"""The unpatched os/select/signal functions, even after gevent.monkey.patch_all().

The master and the supervisor never run a gevent hub: they fork, wait and
select with the real system calls even when the application asked gevent to
patch the standard library.
"""

__all__ = ["original"]


def original(module, name):
    """`module.name` as it was before gevent monkey-patched it (if it did)."""
    try:
        from gevent import monkey
    except ImportError:
        return getattr(__import__(module), name)
    return monkey.get_original(module, name)
