"""Whether and when a worker collects its own cyclic garbage (--worker-gc).

The master keeps cow's recipe whatever the policy: collection off while
loading, gc.freeze() before the first fork, threshold 0. A worker then
applies one policy right after fork:

    off     never collect (threshold 0): cyclic garbage a request leaves
            behind (an exception and its traceback, framework objects that
            point at each other) stays until the worker is recycled.
    young   automatic collections of generations 0 and 1 at Python's
            thresholds; never a full collection.
    normal  Python's default thresholds (700, 10, 10), full collections
            included.
    idle    no automatic collection; the young generations are collected
            when the worker served no request since its last tick (about
            every second), so a collection never pauses a request.

The default is normal, with or without --share-heap ("auto", the name the
default had before, is read as normal).

Why none of them copies the master's pages: gc.freeze() moved every object
the master made into the permanent generation, which no collection examines,
and a collection writes only the GC headers of the objects in the
generations it collects: the worker's own. It reads the headers of frozen
objects that those point to, and reading does not copy. (Measured in
benchmarks/worker_gc.py.)

Why normal: cyclic garbage that lives long enough to be promoted to the
oldest generation (a Django project's request cycle leaves such cycles) is
never collected by young, and a worker's private memory grows with it. A
full collection in a worker examines only the worker's own objects (the
master's are frozen), so it stays cheap. Measured with
benchmarks/share_heap.py on the Flask and Django test apps (3.12, 4
workers, 20,000 requests, two runs; docs/memory.md#garbage-collection-in-workers):
the largest Django worker ended at 21.0-21.3 MiB with normal against
28.3-31.7 with young (Gunicorn --preload: 32.8-32.9), and with --share-heap
at 14.1-14.3 against 21.6-24.2; Flask's were within 0.4 MiB of each other
(9.9-10.1 against 9.8-9.9, 5.9-6.0 against 5.6-5.7).

Collections and their pauses are counted through gc.callbacks and published
in the worker's scoreboard slot, so the master's stats show them.
"""

import gc
import time

from forkserve.memory import cow

__all__ = ["POLICIES", "DEFAULT", "GcStats", "apply", "parse_policy"]

#: policy -> automatic thresholds
_THRESHOLDS = {"off": (0, 10, 10), "young": (700, 10, 1 << 30), "normal": (700, 10, 10),
               "idle": (0, 10, 10)}
POLICIES = tuple(_THRESHOLDS)
#: young bounded the growth of apps whose garbage dies young
#: (benchmarks/results/worker_gc.md: with "off", 20,000 requests grew two
#: workers by 75 MiB and 15 MiB; with "young", by 0.2 and 0.1 MiB at
#: 0.3-0.45 ms per collection; "idle" did not collect under steady load);
#: normal bounds those and the garbage promoted to the oldest generation too
#: ("Why normal" above).
DEFAULT = "normal"


def parse_policy(value):
    """The --worker-gc converter: one of POLICIES."""
    policy = str(value).strip().lower()
    if policy == "auto":  # the default's name before it was normal everywhere
        return DEFAULT
    if policy not in POLICIES:
        raise ValueError(f"expected one of {', '.join(POLICIES)}; got {value!r}")
    return policy


parse_policy.__name__ = "str"


class GcStats:
    """Counts collections and their pause, publishing after each one.

    publish(collections, pause_ns) is called from the gc callback, so it
    must not allocate much: the scoreboard's few memory stores are fine.
    """

    def __init__(self, publish=None, clock=time.perf_counter_ns):
        self.publish = publish
        self.clock = clock
        self.collections = 0
        self.pause_ns = 0
        self._started = None

    def __call__(self, phase, info):
        if phase == "start":
            self._started = self.clock()
        elif self._started is not None:
            self.pause_ns += self.clock() - self._started
            self.collections += 1
            self._started = None
            if self.publish is not None:
                self.publish(self.collections, self.pause_ns)


class _Policy:
    def __init__(self, name, stats):
        self.name = name
        self.stats = stats
        self._requests = None

    def tick(self, requests):
        """Call from the worker's loop: the idle policy collects here."""
        if self.name == "idle":
            if requests == self._requests and gc.get_count()[0] > 0:
                gc.collect(1)
            self._requests = requests


def apply(policy, publish=None):
    """In a worker, right after fork: set the thresholds and count collections.

    Returns an object whose tick(requests) the worker's loop calls.
    """
    cow.set_worker_threshold(_THRESHOLDS[policy])
    stats = GcStats(publish)
    gc.callbacks.append(stats)
    return _Policy(policy, stats)
