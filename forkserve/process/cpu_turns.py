"""Processes that share a CPU take turns a batch of requests at a time.

A worker under load never blocks: by the time it has answered the
connections that were ready, the first of them has sent its next request.
So the kernel takes the CPU from it only at a scheduler tick (every 4 ms
at HZ=250), and with more workers than CPUs a request that arrives for a
worker just preempted waits until every other one has had its tick: with
4 workers on one CPU, hello world's p99 was 12 ms against 1.5 ms for one
process. A threaded server (Granian) does not see this: its threads block
on each other many times a millisecond.

`take_turns` has the process call sched_yield() before its event loop
polls, once TURN seconds of the loop's time have passed since it last did
(and first write the responses its Outbox holds, unless --no-batch-responses:
they would otherwise wait for the other processes' turns):
the next runnable process on the CPU then runs after a batch of requests
instead of after a tick (hello world's p99 with the same 4 workers: 1.8-2.1
ms, at the same throughput within the noise). A yield after every turn of the loop measured the
lowest p99 but cost up to 16% of PersonDB's requests at 8 connections (a
switch per request or two); at most one per TURN kept the p99 low at 8, 64
and 256 connections for no cost outside the noise (the figures:
docs/benchmarks.md, "Workers that share a CPU"). With nothing else
runnable the call returns at once.

Invariants: one watcher per process, started after the hub exists (a
worker's or -w 0's boot) and unreferenced, so it never keeps the loop
running by itself; nothing here runs in the master, which serves nothing.
"""

import os

__all__ = ["take_turns", "TURN"]

#: Seconds of the loop's time between two yields, at the least.
TURN = 0.0005


def take_turns(loop, yield_cpu=os.sched_yield, turn=TURN, before_yield=None):
    """Call `yield_cpu` before the gevent `loop` polls, once `turn` seconds
    of its time (loop.now(), updated at each poll) passed since the last
    call (a libev prepare watcher), `before_yield` first if given; returns
    the watcher, which the caller keeps."""
    now = loop.now
    last = now()

    def take():
        nonlocal last
        at = now()
        if at - last >= turn:
            last = at
            if before_yield is not None:
                before_yield()
            yield_cpu()

    watcher = loop.prepare(ref=False)
    watcher.start(take)
    return watcher
