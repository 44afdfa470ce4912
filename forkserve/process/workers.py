"""What the master knows of each worker it forked: a `WorkerRecord`.

A worker's life as the master sees it: booting (forked, not yet ready),
ready (serving, counted towards the target), retiring (to be replaced:
--max-requests, --max-worker-memory, HUP under a supervisor; still serving
until its replacement is up), stopping (sent TERM or QUIT, with a deadline
after which it gets SIGKILL). Workers that are booting or ready count
towards the target, so a retiring one is replaced before it is stopped.

A worker has two numbers. Its scoreboard slot (`index`) is wherever a slot
was free when it was forked: a replacement starts while the worker it
replaces still holds its slot. Its `number` (worker_id, shown in logs,
process titles and Prometheus labels) is its place in the pool, 1 to the
number of workers: a replacement takes the number of the worker it
replaces, so a recycle leaves the set of numbers, and the metric series
keyed by them, as they were.
"""

__all__ = ["WorkerRecord", "free_number"]


class WorkerRecord:
    """One forked worker, in the master."""

    __slots__ = ("index", "pid", "state", "ready", "deadline", "expected_exit", "generation",
                 "number")

    def __init__(self, index, pid, generation, number=None):
        self.index = index
        self.number = index + 1 if number is None else number
        self.pid = pid
        self.state = "booting"     # booting, ready, retiring, stopping
        self.ready = False
        self.deadline = None       # when a stopping worker gets SIGKILL
        self.expected_exit = False
        self.generation = generation

    @property
    def worker_id(self):
        return self.number

    @property
    def counts_towards_target(self):
        return self.state in ("booting", "ready")


def free_number(records):
    """The lowest worker number no booting or ready worker holds: a retiring
    worker's number goes to its replacement."""
    taken = {record.number for record in records if record.counts_towards_target}
    number = 1
    while number in taken:
        number += 1
    return number
