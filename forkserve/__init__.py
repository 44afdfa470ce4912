"""forkserve: a pre-fork gevent WSGI server whose workers share the master's data."""

__version__ = "0.1.0"

__all__ = ["__version__", "keep_mortal", "share", "ShareReport", "SharingWarning"]


def share(obj):
    """Keep everything reachable from ``obj`` shared between forked workers.

    Call it in the master after loading the dataset. See forkserve.memory.sharing
    for the full contract (immortal objects on 3.12+, hash caching and
    gc.freeze everywhere, a report of what was shared).
    """
    from forkserve.memory.sharing import share as _share

    return _share(obj)


def keep_mortal(obj):
    """Keep ``obj`` out of heap sharing: it, and the data it holds, stay
    ordinary objects that a worker frees when it lets them go (a cache a
    worker fills and replaces). A module: its globals. Call it at import,
    before the heap is shared; returns ``obj``. See docs/memory.md.
    """
    from forkserve.memory.heap import keep_mortal as _keep_mortal

    return _keep_mortal(obj)


def __getattr__(name):
    # Lazily, so `import forkserve` stays light for the server's own use.
    if name in ("ShareReport", "SharingWarning"):
        from forkserve.memory import sharing
        return getattr(sharing, name)
    raise AttributeError(f"module 'forkserve' has no attribute {name!r}")
