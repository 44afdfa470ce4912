"""Gunicorn config for --preload -k gevent apps: monkey-patch before the app loads.

    gunicorn --preload -k gevent -c benchmarks/apps/gunicorn_patched.conf.py APP

With --preload, Gunicorn imports the application in the master, before its
gevent worker monkey-patches (after fork). Thread-locals created during the
import are then real thread-locals shared by every greenlet: Django's
database connections fail with "DatabaseWrapper objects created in a thread
can only be used in that same thread". Patching here, first, is what
forkserve does before it imports an application, so the comparison is like
for like.
"""

from gevent import monkey

monkey.patch_all()
