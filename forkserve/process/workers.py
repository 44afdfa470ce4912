"""What the master knows of each worker it forked: a `WorkerRecord`.

A worker's life as the master sees it: booting (forked, not yet ready),
ready (serving, counted towards the target), retiring (to be replaced:
--max-requests, --max-worker-memory, HUP under a supervisor; still serving
until its replacement is up), stopping (sent TERM or QUIT, with a deadline
after which it gets SIGKILL). Workers that are booting or ready count
towards the target, so a retiring one is replaced before it is stopped.
"""

__all__ = ["WorkerRecord"]


class WorkerRecord:
    """One forked worker, in the master."""

    __slots__ = ("index", "pid", "state", "ready", "deadline", "expected_exit", "generation")

    def __init__(self, index, pid, generation):
        self.index = index
        self.pid = pid
        self.state = "booting"     # booting, ready, retiring, stopping
        self.ready = False
        self.deadline = None       # when a stopping worker gets SIGKILL
        self.expected_exit = False
        self.generation = generation

    @property
    def worker_id(self):
        return self.index + 1

    @property
    def counts_towards_target(self):
        return self.state in ("booting", "ready")
