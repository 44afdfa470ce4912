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
- `requests` is stored by the worker's loop before each poll, not per request
  (forkserve.process.worker): a reader sees every request answered before
  the worker last waited for I/O.
- `span` (one word after the last slot) is one more than the highest slot
  the master ever prepared: workers reading their peers' loads
  (forkserve.process.balance) stop there instead of at `capacity`.
"""

import mmap
import struct
import time

__all__ = ["Scoreboard", "Slot", "BOOTING", "READY", "RETIRE", "STOPPING",
           "heartbeat_interval"]

FREE, BOOTING, READY, RETIRE, STOPPING = 0, 1, 2, 3, 4

#: state, beat (monotonic), requests, gc collections, gc pause (ns), open
#: connections, connections accepted; the rest of the 64-byte slot is
#: padding so that two workers never write to the same cache line
_LAYOUT = struct.Struct("=qdQQQQQ")
_SLOT_SIZE = 64
_STATE, _BEAT, _REQUESTS, _GC, _CONNECTIONS = 0, 8, 16, 24, 40


def heartbeat_interval(timeout: float) -> float:
    """Beat often enough that a healthy worker is never mistaken for a stuck one."""
    if timeout <= 0:
        return 1.0
    return max(0.05, min(1.0, timeout / 4.0))


class Slot:
    __slots__ = ("index", "state", "beat", "requests", "gc_collections", "gc_pause_ns",
                 "connections", "accepted")

    def __init__(self, index, state, beat, requests, gc_collections=0, gc_pause_ns=0,
                 connections=0, accepted=0):
        self.index = index
        self.state = state
        self.beat = beat
        self.requests = requests
        self.gc_collections = gc_collections
        self.gc_pause_ns = gc_pause_ns
        self.connections = connections  # open now
        self.accepted = accepted        # since the worker started


class Scoreboard:
    #: Slots available. TTIN beyond this is refused; 1024 slots cost 64 KiB.
    capacity = 1024

    def __init__(self, capacity=None, *, clock=time.monotonic):
        if capacity is not None:
            self.capacity = capacity
        #: the clock of the beats: the master's, which compares them with its
        #: own (a test injects one; a worker's monotonic clock is the master's)
        self.clock = clock
        self._mem = mmap.mmap(-1, self.capacity * _SLOT_SIZE + 8)  # + span
        #: the same memory as native 8-byte words, for the stores of a worker's loop
        self._words = memoryview(self._mem).cast("Q")

    # --- master side ---

    def prepare(self, index):
        """Reset a slot for a worker about to be forked."""
        _LAYOUT.pack_into(self._mem, index * _SLOT_SIZE, BOOTING, self.clock(), 0, 0, 0, 0, 0)
        span = self.capacity * _SLOT_SIZE >> 3
        self._words[span] = max(self._words[span], index + 1)

    def release(self, index):
        _LAYOUT.pack_into(self._mem, index * _SLOT_SIZE, FREE, 0.0, 0, 0, 0, 0, 0)

    def read(self, index) -> Slot:
        return Slot(index, *_LAYOUT.unpack_from(self._mem, index * _SLOT_SIZE))

    # --- worker side: each call is a few memory stores ---

    def beat(self, index):
        struct.pack_into("=d", self._mem, index * _SLOT_SIZE + _BEAT, self.clock())

    def set_state(self, index, state):
        struct.pack_into("=q", self._mem, index * _SLOT_SIZE + _STATE, state)

    def set_requests(self, index, served):
        self._words[(index * _SLOT_SIZE + _REQUESTS) >> 3] = served

    def set_connections(self, index, open_now, accepted):
        words, at = self._words, (index * _SLOT_SIZE + _CONNECTIONS) >> 3
        words[at] = open_now
        words[at + 1] = accepted

    def loads(self, exclude):
        """Open connections of every READY worker but slot `exclude`."""
        words, step = self._words, _SLOT_SIZE >> 3
        return [words[i * step + (_CONNECTIONS >> 3)]
                for i in range(words[self.capacity * step]) if i != exclude
                and words[i * step] == READY]

    def set_gc(self, index, collections, pause_ns):
        struct.pack_into("=QQ", self._mem, index * _SLOT_SIZE + _GC, collections, pause_ns)

    def close(self):
        self._words.release()
        self._mem.close()
