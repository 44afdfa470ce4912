"""systemd's two protocols: socket activation (LISTEN_FDS) and sd_notify.

Only the process systemd started (the master, later the supervisor, same
PID) notifies: generation_protocol.spawn_generation() gives a generation no NOTIFY_SOCKET.
"""

import os
import socket
import time

__all__ = ["notify", "listen_fds", "NOTIFY_SOCKET", "LISTEN_FDS", "LISTEN_PID",
           "LISTEN_FDNAMES"]

#: where sd_notify messages go (a path, or "@name" in the abstract namespace)
NOTIFY_SOCKET = "NOTIFY_SOCKET"
#: socket activation: how many descriptors, for which pid, and their names
LISTEN_FDS, LISTEN_PID, LISTEN_FDNAMES = "LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES"
#: the first descriptor systemd passes (sd_listen_fds(3))
LISTEN_FDS_START = 3


def listen_fds(environ, pid):
    """The descriptors systemd passed to `pid`, taken out of `environ`; None if none.

    The variables are removed so that processes the application starts do
    not take the sockets for theirs.
    """
    count, for_pid = environ.get(LISTEN_FDS), environ.get(LISTEN_PID)
    for name in (LISTEN_FDS, LISTEN_PID, LISTEN_FDNAMES):
        environ.pop(name, None)
    if not count or for_pid != str(pid):
        return None
    return tuple(range(LISTEN_FDS_START, LISTEN_FDS_START + int(count)))


def notify(*states):
    """Send states such as "READY=1" to systemd; a no-op outside systemd."""
    address = os.environ.get(NOTIFY_SOCKET)
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]  # abstract namespace
    message = "\n".join(states)
    if "RELOADING=1" in states:
        message += f"\nMONOTONIC_USEC={time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
        try:
            sock.connect(address)
            sock.sendall(message.encode())
        except OSError:
            return False  # systemd went away; nothing to tell
    return True
