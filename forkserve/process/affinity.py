"""--cpu-affinity: each worker runs on one CPU, the workers spread evenly over
the CPUs the server may use.

Why: with more busy workers than CPUs (4 workers on 2 CPUs), the kernel
moves workers between CPUs and wakes them where the client that woke them
runs; connections spread evenly over the workers (forkserve.process.balance)
then wait behind that juggling. Pinned, two workers share each CPU and stay
there: benchmarks/balance.py measured the p99 and req/s (docs/http.md).
By default ("auto") workers are pinned only while there are more of them
than CPUs: nginx's worker_cpu_affinity and uWSGI's cpu-affinity are off by
default, because a pinned worker cannot move off a CPU that something else
keeps busy and two servers on one machine would pin their first workers to
the same CPU. With more workers than CPUs every CPU gets workers of every
such server, and the CPUs are already oversubscribed; with a CPU kept busy
by another process, pinned workers measured more req/s than unpinned ones
and a p99 1.2x theirs (docs/http.md).

Invariants:
- Workers are pinned only to CPUs in the master's own affinity set (a
  container's cpuset, taskset), read as each worker is forked: never to one
  the server may not use.
- Worker number n (1-based, the number a replacement inherits) gets the
  ((n - 1) mod k)-th of the k allowed CPUs, in ascending order: a recycled or
  killed worker's replacement runs where it did, and no CPU holds two
  workers more than another.
- The choice is made in the master for each worker as it is forked, from
  the number of workers then (TTIN/TTOU change it for the next ones).
- Pinning never stops a worker: if the kernel refuses, the worker logs a
  warning and runs unpinned.
"""

import logging
import os

__all__ = ["choose", "cpu_for", "pin"]

log = logging.getLogger("forkserve.error")


def cpu_for(number, allowed):
    """The CPU for worker `number` (1-based) among the `allowed` CPU numbers."""
    cpus = sorted(allowed)
    return cpus[(number - 1) % len(cpus)]


def choose(mode, number, workers, allowed):
    """The CPU to pin worker `number` of `workers` to, or None: `mode` is the
    setting (auto, on, off), `allowed` the CPUs the master may run on."""
    if mode == "on" or mode == "auto" and workers > len(allowed):
        return cpu_for(number, allowed)
    return None


def pin(number, cpu, setaffinity=os.sched_setaffinity):
    """Pin this process, worker `number`, to `cpu`; the CPU, or None if the
    kernel refused (logged)."""
    try:
        setaffinity(0, {cpu})
    except OSError as exc:
        log.warning("worker %d: --cpu-affinity could not pin it to CPU %d (%s); it runs on "
                    "any CPU", number, cpu, exc.strerror or exc)
        return None
    return cpu
