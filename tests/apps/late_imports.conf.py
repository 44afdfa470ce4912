"""Notes which modules the master had when its heap was shared."""

import sys


def post_freeze(server):
    import late_imports
    late_imports.SHARED = set(sys.modules)
