"""A shorter scheduler time slice for a worker (--worker-slice), Linux 6.12+.

Invariants, and why:

- Linux's EEVDF scheduler (6.6+) gives each runnable task a virtual
  deadline of "eligible time + slice / weight" and runs the eligible task
  whose deadline is earliest. Since 6.12 a SCHED_OTHER/SCHED_BATCH task may
  ask for its own slice with sched_setattr(2): `sched_attr.sched_runtime`,
  in nanoseconds, which the kernel clamps to 0.1-100 ms (0 means the
  kernel's base slice again). A shorter slice is preempted sooner, and
  wakes with an earlier deadline, so it runs sooner after a wake-up and may
  preempt a task with a longer slice (the kernel's PREEMPT_SHORT).
- Only this calling thread changes (pid 0 is "the caller"); threads and
  processes it starts afterwards inherit the slice.
- The request keeps the process's policy (SCHED_FLAG_KEEP_POLICY) and its
  nice value (read first and passed back: sched_setattr would otherwise set
  nice 0, and lowering nice needs privilege). Real-time policies have no
  slice: the request is not made for them.
- A kernel that refuses (older than 6.12 ignores sched_runtime for these
  policies; seccomp or a container may forbid the call) is reported, never
  raised: the worker serves on with the kernel's slice. Reading the slice
  back (sched_getattr) is how a caller tells an old kernel that accepted the
  call and ignored the field.

Packing is pure (forkserve.config.values parses the setting); `request()`
and `current()` make the calls, `apply()` logs what came of one.
"""

import ctypes
import errno
import logging
import os
import platform
import struct

__all__ = ["SliceRefused", "apply", "attr_bytes", "current", "request", "slice_from"]

log = logging.getLogger("forkserve.error")

#: sched_setattr / sched_getattr numbers by machine (unistd.h; not in `os`)
_SYSCALLS = {"x86_64": (314, 315), "aarch64": (274, 275)}
#: struct sched_attr up to sched_util_max (SCHED_ATTR_SIZE_VER1): size, policy,
#: flags, nice, priority, runtime, deadline, period, util_min, util_max
_ATTR = struct.Struct("=IIQiIQQQII")
_KEEP_POLICY = 0x08  # SCHED_FLAG_KEEP_POLICY
_FAIR_POLICIES = (os.SCHED_OTHER, os.SCHED_BATCH, os.SCHED_IDLE)


class SliceRefused(Exception):
    """The kernel did not give this process the slice; the message says why
    and what to do."""


def attr_bytes(slice_ns, nice):
    """The struct sched_attr that asks for `slice_ns`, keeping policy and nice."""
    return _ATTR.pack(_ATTR.size, 0, _KEEP_POLICY, nice, 0, slice_ns, 0, 0, 0, 0)


def slice_from(raw):
    """The slice, in ns, in a struct sched_attr the kernel filled."""
    return _ATTR.unpack_from(raw)[5]


def _syscalls():
    numbers = _SYSCALLS.get(platform.machine())
    if numbers is None:
        raise SliceRefused(f"--worker-slice: this machine ({platform.machine()}) is not one "
                           "forkserve knows the sched_setattr call number for; drop the "
                           "setting")
    return numbers


def current() -> int:
    """This thread's slice in nanoseconds, as sched_getattr(2) gives it
    (on kernels before 6.12 it is 0 for non-deadline tasks)."""
    _, getattr_ = _syscalls()
    raw = ctypes.create_string_buffer(_ATTR.size)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(getattr_, 0, raw, _ATTR.size, 0) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    return slice_from(raw.raw)


def request(milliseconds) -> int:
    """Ask the kernel for a slice of `milliseconds` for this thread; the
    slice it then has, in ns. Raises SliceRefused, saying what to do, if the
    kernel refused the call or ignored the field."""
    setattr_, _ = _syscalls()
    policy = os.sched_getscheduler(0)
    if policy not in _FAIR_POLICIES:
        raise SliceRefused("--worker-slice: this process runs under a real-time scheduling "
                           f"policy ({policy}), which has no slice; drop the setting or run "
                           "forkserve under SCHED_OTHER")
    wanted = round(milliseconds * 1e6)
    raw = ctypes.create_string_buffer(attr_bytes(wanted, os.getpriority(os.PRIO_PROCESS, 0)),
                                      _ATTR.size)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(setattr_, 0, raw, 0) != 0:
        code = ctypes.get_errno()
        if code in (errno.ENOSYS, errno.EPERM, errno.EINVAL, errno.E2BIG):
            raise SliceRefused(f"--worker-slice {milliseconds:g}: the kernel refused "
                               f"sched_setattr ({os.strerror(code)}); the workers keep the "
                               "kernel's slice (drop the setting to silence this)")
        raise OSError(code, os.strerror(code))
    got = current()
    if got != wanted:
        raise SliceRefused(f"--worker-slice {milliseconds:g}: the kernel kept a slice of "
                           f"{got / 1e6:g} ms (a custom slice needs Linux 6.12 or later, "
                           f"this is {platform.release()}); drop the setting")
    return got


def apply(milliseconds, who):
    """--worker-slice in the process `who` names ("worker 3"): nothing for 0;
    a refusal is a warning and the process serves on with the kernel's slice."""
    if not milliseconds:
        return
    try:
        got = request(milliseconds)
    except SliceRefused as exc:
        log.warning("%s (pid %d): %s", who, os.getpid(), exc)
        return
    log.debug("%s (pid %d): scheduler time slice %g ms", who, os.getpid(), got / 1e6)
