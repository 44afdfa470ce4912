"""systemd readiness notification (sd_notify), used only when NOTIFY_SOCKET is set.

Socket activation (LISTEN_FDS) is adopted in forkserve.reload.adopted_listeners.
Only the process systemd started (the master, later the supervisor, same PID)
notifies; generations started for a reload stay quiet.
"""

import os
import socket
import time

__all__ = ["notify"]


def notify(*states):
    """Send states such as "READY=1" to systemd; a no-op outside systemd."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address or os.environ.get("FORKSERVE__ROLE") == "generation":
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
