"""--worker-slice: each worker asks the kernel for a shorter scheduler time
slice (sched_setattr, Linux 6.12+), keeps its policy and nice value, and a
kernel that refuses the call leaves a warning and a serving worker."""

import ctypes
import os
import platform
import re
import struct

import pytest

from forkserve.config import settings
from forkserve.config.values import ConfigError
from forkserve.process import timeslice

KERNEL = tuple(int(part) for part in re.findall(r"\d+", platform.release())[:2])
needs_custom_slice = pytest.mark.skipif(
    KERNEL < (6, 12) or platform.machine() != "x86_64",
    reason="a custom EEVDF slice needs Linux 6.12+ (tested on x86_64)")


def sched_fields(pid):
    """/proc/PID/sched's `name : value` lines as {name: int}."""
    with open(f"/proc/{pid}/sched") as handle:
        found = re.findall(r"^([\w.>-]+)\s+:\s+(-?\d+)(?:\.\d+)?$", handle.read(), re.M)
    return {name: int(value) for name, value in found}


def deny_sched_setattr():
    """Popen preexec_fn: a seccomp filter under which the kernel answers
    sched_setattr with EPERM (and allows every other call), inherited by the
    server and its workers."""
    sock_filter = struct.Struct("=HBBI")
    program = b"".join(sock_filter.pack(*insn) for insn in (
        (0x20, 0, 0, 4),            # load seccomp_data.arch
        (0x15, 1, 0, 0xC000003E),   # x86_64? skip the next
        (0x06, 0, 0, 0x7FFF0000),   # another ABI: allow
        (0x20, 0, 0, 0),            # load seccomp_data.nr
        (0x15, 0, 1, 314),          # sched_setattr?
        (0x06, 0, 0, 0x00050000 | 1),  # yes: SECCOMP_RET_ERRNO | EPERM
        (0x06, 0, 0, 0x7FFF0000)))  # no: allow
    instructions = ctypes.create_string_buffer(program, len(program))

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    prog = SockFprog(len(program) // sock_filter.size, ctypes.addressof(instructions))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    if libc.prctl(22, 2, ctypes.byref(prog), 0, 0) != 0:  # PR_SET_SECCOMP, FILTER
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP)")


def batch_and_nice_5():
    """Popen preexec_fn: the server starts under SCHED_BATCH at nice 5."""
    os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    os.nice(5)


# --- the setting ---

@pytest.mark.parametrize("text, expected", [("0", 0.0), ("0.1", 0.1), ("0.5", 0.5),
                                            ("100", 100.0)])
def test_worker_slice_accepts_zero_and_the_kernels_range(text, expected):
    assert settings.parse(["--worker-slice", text, "app:app"]).worker_slice == expected


@pytest.mark.parametrize("text", ["0.05", "101", "-1", "fast"])
def test_worker_slice_outside_the_kernels_range_is_refused_with_the_range(text):
    with pytest.raises(ConfigError, match=r"0 \(the kernel's slice\) or 0\.1 to 100|"
                                          r"0, or 0\.1 to 100"):
        settings.parse(["--worker-slice", text, "app:app"])


def test_worker_slice_defaults_to_the_kernels_slice():
    assert settings.parse(["app:app"]).worker_slice == 0


def test_slice_request_keeps_policy_and_passes_nice_and_nanoseconds():
    raw = timeslice.attr_bytes(500_000, 5)
    size, policy, flags, nice, _, runtime = struct.unpack_from("=IIQiIQ", raw)
    assert (size, policy, flags, nice, runtime) == (len(raw), 0, 0x08, 5, 500_000)
    assert timeslice.slice_from(raw) == 500_000


# --- the real kernel ---

@pytest.mark.e2e
@needs_custom_slice
def test_workers_run_with_the_slice_they_asked_for(run_server):
    server = run_server("-w", "2", "--worker-slice", "0.5")
    pids = server.wait_workers(2)
    assert [sched_fields(pid)["se.slice"] for pid in pids] == [500_000, 500_000]
    assert sched_fields(server.pid)["se.slice"] != 500_000  # the master keeps the kernel's


@pytest.mark.e2e
@needs_custom_slice
def test_worker_slice_keeps_the_policy_and_nice_value_it_started_with(run_server):
    server = run_server("-w", "1", "--worker-slice", "0.25", preexec_fn=batch_and_nice_5)
    (pid,) = server.wait_workers(1)
    fields = sched_fields(pid)
    assert fields["se.slice"] == 250_000
    assert fields["policy"] == os.SCHED_BATCH
    assert fields["prio"] == 125  # 120 + nice 5


@pytest.mark.e2e
@needs_custom_slice
def test_single_process_runs_with_the_worker_slice(run_server):
    server = run_server("-w", "0", "--worker-slice", "2")
    status, pid = server.get("/pid")
    assert status == 200
    assert sched_fields(int(pid))["se.slice"] == 2_000_000


@pytest.mark.e2e
@needs_custom_slice
def test_kernel_refusing_the_slice_is_a_warning_and_workers_serve(run_server):
    server = run_server("-w", "2", "--worker-slice", "0.5", preexec_fn=deny_sched_setattr)
    pids = server.wait_workers(2)
    assert all(sched_fields(pid)["se.slice"] != 500_000 for pid in pids)
    assert server.get("/pid")[0] == 200
    log = server.log()
    for number in (1, 2):
        assert re.search(rf"WARNING\] worker {number} \(pid \d+\): --worker-slice 0\.5: the "
                         r"kernel refused sched_setattr \(Operation not permitted\); the "
                         r"workers keep the kernel's slice", log), log
    assert "Traceback" not in log
