"""--cpu-affinity: each worker runs on one CPU, the workers spread evenly over
the CPUs the server may use.

Why: with more busy workers than CPUs (4 workers on 2 CPUs), the kernel
moves workers between CPUs and wakes them where the client that woke them
runs; connections spread evenly over the workers (forkserve.process.balance)
then wait behind that juggling. Pinned, two workers share each CPU and stay
there: benchmarks/balance.py measured the p99 and req/s (docs/http.md).
It is off by default, as nginx's worker_cpu_affinity and uWSGI's
cpu-affinity are: a pinned worker cannot move off a CPU that something else
keeps busy, and two servers on one machine would pin their first workers to
the same CPU.

Invariants:
- Workers are pinned only to CPUs in the master's own affinity set (a
  container's cpuset, taskset), read when the worker starts: never to one the
  server may not use.
- Worker number n (1-based, the number a replacement inherits) gets the
  ((n - 1) mod k)-th of the k allowed CPUs, in ascending order: a recycled or
  killed worker's replacement runs where it did, and no CPU holds two
  workers more than another.
- Pinning never stops a worker: if the kernel refuses, the worker logs a
  warning and runs unpinned.
"""

import logging
import os

__all__ = ["cpu_for", "pin"]

log = logging.getLogger("forkserve.error")


def cpu_for(number, allowed):
    """The CPU for worker `number` (1-based) among the `allowed` CPU numbers."""
    cpus = sorted(allowed)
    return cpus[(number - 1) % len(cpus)]


def pin(number, getaffinity=os.sched_getaffinity, setaffinity=os.sched_setaffinity):
    """Pin this process, worker `number`, to its CPU; the CPU, or None if the
    kernel refused (logged)."""
    cpu = cpu_for(number, getaffinity(0))
    try:
        setaffinity(0, {cpu})
    except OSError as exc:
        log.warning("worker %d: --cpu-affinity could not pin it to CPU %d (%s); it runs on "
                    "any CPU", number, cpu, exc.strerror or exc)
        return None
    return cpu
