"""daemon = True: detach from the terminal as Gunicorn does, for systems with
no supervisor (under systemd or another supervisor, leave it off: the
supervisor would see the first process exit and the server run on
unsupervised).

Done first thing at boot, before logging is set up, anything is bound or
the application is loaded, so the server's own start (its log, its pid file
with --pid) happens in the detached process. A generation that a reload
starts is not detached again: its supervisor keeps the pid file.
"""

import os

__all__ = ["detach"]


def detach(keep_stdio=False):
    """Fork twice with setsid() in between, so the server is no session
    leader and can never take a controlling terminal; the original process
    exits 0 at once. umask 022, as Gunicorn. Standard input always, and
    stdout and stderr unless `keep_stdio` (enable_stdio_inheritance), go to
    /dev/null: log to a file (error_logfile) or syslog."""
    if os.fork():
        os._exit(0)
    os.setsid()
    if os.fork():
        os._exit(0)
    os.umask(0o22)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0,) if keep_stdio else (0, 1, 2):
        os.dup2(null, fd)
    if null > 2:
        os.close(null)
