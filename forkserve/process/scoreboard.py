"""A shared-memory scoreboard: how workers tell the master they are alive.

The master maps one anonymous shared page range before forking; each worker
owns one fixed-size slot and writes into it with plain memory stores — no
system call, no file, no pipe on the request path. The master reads every
slot on each turn of its loop.

Invariants:
- The master writes a slot only while no live worker owns it (before fork,
  and after reaping). A worker writes only its own slot.
- Each field is an aligned 8-byte value, so a reader never sees half of one
  field; a reader may see fields from two different moments, which is fine
  for heartbeats and counters.
- `beat` is CLOCK_MONOTONIC seconds, which every process on the host shares.
"""

import mmap
import struct
import time

__all__ = ["Scoreboard", "Slot", "BOOTING", "READY", "RETIRE", "STOPPING"]

FREE, BOOTING, READY, RETIRE, STOPPING = 0, 1, 2, 3, 4

#: pid, state, beat (monotonic), started (wall clock), requests, generation,
#: gc collections, gc pause (ns)
_LAYOUT = struct.Struct("=qqddQqQQ")
_SLOT_SIZE = 64
_PID, _STATE, _BEAT, _STARTED, _REQUESTS, _GENERATION, _GC = (0, 8, 16, 24, 32, 40, 48)


class Slot:
    __slots__ = ("index", "pid", "state", "beat", "started", "requests", "generation",
                 "gc_collections", "gc_pause_ns")

    def __init__(self, index, pid, state, beat, started, requests, generation,
                 gc_collections=0, gc_pause_ns=0):
        self.index = index
        self.pid = pid
        self.state = state
        self.beat = beat
        self.started = started
        self.requests = requests
        self.generation = generation
        self.gc_collections = gc_collections
        self.gc_pause_ns = gc_pause_ns

    @property
    def worker_id(self):
        return self.index + 1


class Scoreboard:
    #: Slots available. TTIN beyond this is refused; 1024 slots cost 64 KiB.
    capacity = 1024

    def __init__(self, capacity=None):
        if capacity is not None:
            self.capacity = capacity
        self._mem = mmap.mmap(-1, self.capacity * _SLOT_SIZE)

    # --- master side ---

    def prepare(self, index, generation=0):
        """Reset a slot for a worker about to be forked."""
        now = time.monotonic()
        _LAYOUT.pack_into(self._mem, index * _SLOT_SIZE, 0, BOOTING, now, time.time(), 0,
                          generation, 0, 0)

    def set_pid(self, index, pid):
        struct.pack_into("=q", self._mem, index * _SLOT_SIZE + _PID, pid)

    def release(self, index):
        _LAYOUT.pack_into(self._mem, index * _SLOT_SIZE, 0, FREE, 0.0, 0.0, 0, 0, 0, 0)

    def read(self, index) -> Slot:
        return Slot(index, *_LAYOUT.unpack_from(self._mem, index * _SLOT_SIZE))

    # --- worker side: each call is a few memory stores ---

    def beat(self, index):
        struct.pack_into("=d", self._mem, index * _SLOT_SIZE + _BEAT, time.monotonic())

    def set_state(self, index, state):
        struct.pack_into("=q", self._mem, index * _SLOT_SIZE + _STATE, state)

    def count_request(self, index):
        offset = index * _SLOT_SIZE + _REQUESTS
        (count,) = struct.unpack_from("=Q", self._mem, offset)
        struct.pack_into("=Q", self._mem, offset, count + 1)

    def set_gc(self, index, collections, pause_ns):
        struct.pack_into("=QQ", self._mem, index * _SLOT_SIZE + _GC, collections, pause_ns)

    def close(self):
        self._mem.close()
