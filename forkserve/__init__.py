"""forkserve: a pre-fork gevent WSGI server whose workers share the master's data."""

__version__ = "0.1.0"

__all__ = ["__version__", "share"]


def share(obj):
    """Keep everything reachable from ``obj`` shared between forked workers.

    See forkserve.share for the full contract.
    """
    from forkserve.share import share as _share

    return _share(obj)
