"""--max-worker-memory's per-request check (memory.limit), with injected readings."""

import os

import pytest

from forkserve.memory import limit, procfs

MIB = 2**20


class Readings:
    def __init__(self, anonymous, private):
        self.anonymous, self.private, self.exact = anonymous, private, 0

    def read_anonymous(self):
        return self.anonymous

    def read_private(self):
        self.exact += 1
        return self.private


def test_no_exact_reading_while_anonymous_memory_is_under_the_limit():
    readings = Readings(anonymous=90 * MIB, private=10 * MIB)
    check = limit.MemoryLimit(100 * MIB, readings.read_anonymous, readings.read_private)
    assert check.over() is None
    assert readings.exact == 0


def test_shared_anonymous_memory_read_once_then_only_growth_counts():
    # 1 GiB of the master's heap still shared: anonymous is over the limit,
    # private is not; one exact reading, then none until private could be over.
    readings = Readings(anonymous=1034 * MIB, private=10 * MIB)
    check = limit.MemoryLimit(100 * MIB, readings.read_anonymous, readings.read_private)
    assert check.over() is None and readings.exact == 1
    readings.anonymous += 50 * MIB
    readings.private += 50 * MIB
    assert check.over() is None and readings.exact == 1
    readings.anonymous += 45 * MIB
    readings.private += 45 * MIB
    assert check.over() == 105 * MIB and readings.exact == 2


def test_an_unreadable_private_reading_is_not_over():
    readings = Readings(anonymous=200 * MIB, private=None)
    check = limit.MemoryLimit(100 * MIB, readings.read_anonymous, readings.read_private)
    assert check.over() is None


def test_statm_gives_resident_anonymous_bytes():
    assert procfs.parse_statm_anonymous(b"5000 300 100 10 0 200 0\n", 4096) == 200 * 4096
    with pytest.raises(ValueError, match="statm"):
        procfs.parse_statm_anonymous(b"", 4096)


def test_statm_reader_sees_this_process_allocate():
    read, fd = limit.statm_reader(os.getpid())
    try:
        before = read()
        block = bytearray(64 * MIB)
        for offset in range(0, len(block), 4096):
            block[offset] = 1
        assert read() - before > 60 * MIB
    finally:
        os.close(fd)


def test_libev_out_of_descriptors_is_a_resource_error_not_a_crash():
    from forkserve.process.worker import _out_of_descriptors
    assert _out_of_descriptors(SystemError(
        "(libev) error creating signal/async pipe: Too many open files"))
    assert _out_of_descriptors(OSError(24, "Too many open files"))
    assert not _out_of_descriptors(OSError(13, "Permission denied"))
    assert not _out_of_descriptors(SystemError("something else"))
