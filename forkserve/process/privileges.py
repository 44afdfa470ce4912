"""Dropping root privileges in workers, after the master has bound its sockets."""

import grp
import os
import pwd

__all__ = ["resolve", "drop"]


class PrivilegeError(Exception):
    """A --user/--group value cannot be used; the message says why."""


def resolve(user, group):
    """Turn --user/--group values into (uid, gid); None where not given."""
    uid = gid = None
    if user is not None:
        try:
            entry = pwd.getpwuid(int(user)) if str(user).isdigit() else pwd.getpwnam(user)
        except (KeyError, ValueError):
            raise PrivilegeError(f"--user {user!r}: no such user on this machine") from None
        uid, gid = entry.pw_uid, entry.pw_gid
    if group is not None:
        try:
            entry = grp.getgrgid(int(group)) if str(group).isdigit() else grp.getgrnam(group)
        except (KeyError, ValueError):
            raise PrivilegeError(f"--group {group!r}: no such group on this machine") from None
        gid = entry.gr_gid
    return uid, gid


def check(user, group):
    """Fail early, in the master, if the switch cannot work."""
    uid, gid = resolve(user, group)
    if (uid is not None and uid != os.geteuid()) or (gid is not None and gid != os.getegid()):
        if os.geteuid() != 0:
            raise PrivilegeError("--user/--group need the master to run as root; drop them or "
                                 "start forkserve as root")
    return uid, gid


def drop(user, group):
    """Switch this process to the given user/group (group first, while still root)."""
    uid, gid = resolve(user, group)
    if gid is not None and gid != os.getegid():
        os.setgroups([gid])
        os.setgid(gid)
    if uid is not None and uid != os.geteuid():
        if gid is None:
            os.setgroups([])
        os.initgroups(pwd.getpwuid(uid).pw_name, gid if gid is not None else os.getgid())
        os.setuid(uid)
