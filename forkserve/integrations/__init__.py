"""Integrations with other tools, each imported only when used.

bottle  `bottle.run(app, server="forkserve")` (public as forkserve.bottle)
locust  a Locust plugin that starts forkserve and records its memory
"""
