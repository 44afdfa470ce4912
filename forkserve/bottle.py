"""Public name of the Bottle adapter: see forkserve.integrations.bottle.

    import bottle, forkserve.bottle          # registers server="forkserve"
"""

from forkserve.integrations.bottle import ForkserveServer

__all__ = ["ForkserveServer"]
