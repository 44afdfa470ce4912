"""Processes that share a CPU take turns a batch of requests at a time.

A worker under load never blocks: by the time it has answered the
connections that were ready, the first of them has sent its next request.
So the kernel takes the CPU from it only at a scheduler tick (every 4 ms
at HZ=250), and with more workers than CPUs a request that arrives for a
worker just preempted waits until every other one has had its tick: with
4 workers on one CPU, hello world's p99 was 12 ms against 1.2 ms for one
process (benchmarks/throughput.py). A threaded server (Granian) does not
see this: its threads block on each other many times a millisecond.

`take_turns` has the process call sched_yield() once per turn of its event
loop, before the loop polls: the next runnable process on the CPU runs
after each batch instead of after each tick (p99 1.6 ms with the same 4
workers at the same throughput). With nothing else runnable the call
returns at once: one system call per turn of the loop, not per request.

Invariants: one watcher per process, started after the hub exists (a
worker's or -w 0's boot) and unreferenced, so it never keeps the loop
running by itself; nothing here runs in the master, which serves nothing.
"""

import os

__all__ = ["take_turns"]


def take_turns(loop, yield_cpu=os.sched_yield):
    """Call `yield_cpu` once per turn of the gevent `loop` (a libev prepare
    watcher); returns the watcher, which the caller keeps."""
    watcher = loop.prepare(ref=False)
    watcher.start(yield_cpu)
    return watcher
