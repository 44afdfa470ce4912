"""Gunicorn hooks applying the copy-on-write gc recipe (the "gunicorn-gc" server).

    gunicorn --preload -k gevent -w 4 -c benchmarks/apps/gunicorn.conf.py examples.persondb.app:app

The same discipline forkserve applies, done by hand with Gunicorn's hooks,
to show what the recipe alone buys on a stock pre-fork server:

1. gc.disable() while the application loads. Gunicorn executes this file
   in the master before it imports the app (--preload), so the statement at
   module level below runs first. Loading millions of objects then triggers
   no collections (faster), and no collection runs between load and fork.
2. pre_fork: gc.freeze() moves every object tracked so far to the permanent
   generation, so no later collection in a worker walks (and writes the GC
   headers of) the inherited objects; gc.set_threshold(0) makes sure no
   automatic collection runs at all, even if a library calls gc.enable().
3. post_fork: in the worker, atexit.register(os._exit, 0) ends the process
   right after the application's own atexit handlers, skipping the final
   collection and module teardown that would touch, and copy, every page.

What it cannot fix: reading an object still writes its reference count, so
the pages holding the rows a worker serves are copied anyway. Only immortal
objects (forkserve.share on 3.12+) or data outside Python objects
(forkserve.store) avoid that.
"""

import atexit
import gc
import os

gc.disable()


def pre_fork(server, worker):
    gc.freeze()
    gc.set_threshold(0)


def post_fork(server, worker):
    gc.set_threshold(0)
    atexit.register(os._exit, 0)
