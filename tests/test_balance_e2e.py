"""Keep-alive connections spread over the workers (forkserve.process.balance):
with 4 workers, 8 connections opened at once end up 2 on each; a replacement
for a killed worker takes the next connections; after a HUP reload the new
generation spreads them too; and none of it refuses a connection."""

import collections
import http.client
import json
import os
import re
import signal
import threading
import time
import urllib.request

import pytest

from forkserve_testing import poll
from test_reload_e2e import HANDED_OVER

pytestmark = pytest.mark.e2e

STATS = re.compile(r"Stats at: http://127\.0\.0\.1:(\d+)")


def hold(port, count):
    """`count` keep-alive connections, all connected before any sends a
    request (a burst in the listen queue), each asked GET /pid once and kept
    open; returns [(connection, worker pid)]."""
    conns = [http.client.HTTPConnection("127.0.0.1", port, timeout=15) for _ in range(count)]
    try:
        for conn in conns:
            conn.connect()
        held = []
        for conn in conns:
            conn.request("GET", "/pid")
            response = conn.getresponse()
            assert response.status == 200
            held.append((conn, int(response.read())))
        return held
    except BaseException:
        for conn in conns:
            conn.close()
        raise


def close_all(held):
    for conn, _ in held:
        conn.close()


def worker_connections(stats_port):
    """{worker pid: open connections} from the stats endpoint's JSON."""
    with urllib.request.urlopen(f"http://127.0.0.1:{stats_port}/json", timeout=10) as response:
        report = json.loads(response.read())
    return {p["pid"]: p["connections"] for p in report["processes"] if p["role"] == "worker"}


class Churn:
    """A thread opening a new connection per request (GET /pid, then close)
    until stopped; a refused connection is recorded, never retried."""

    def __init__(self, port, seconds=120):
        self.port, self.deadline = port, time.monotonic() + seconds
        self.served, self.refused, self.other = 0, [], collections.Counter()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run)

    def run(self):
        while not self.stop.is_set() and time.monotonic() < self.deadline:
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=15)
            try:
                conn.request("GET", "/pid", headers={"Connection": "close"})
                conn.getresponse().read()
                self.served += 1
            except ConnectionRefusedError as exc:
                self.refused.append(repr(exc))
            except (http.client.HTTPException, OSError) as exc:
                self.other[type(exc).__name__] += 1  # e.g. reset by the killed worker
            finally:
                conn.close()

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(30)


def test_eight_keep_alive_connections_opened_at_once_reach_all_four_workers(run_server):
    server = run_server("-w", "4", "--stats", "127.0.0.1:0")
    workers = server.wait_workers(4)
    stats_port = int(poll(lambda: STATS.search(server.log()), message="the stats line").group(1))
    held = hold(server.port, 8)
    try:
        def each_holds_one():
            counts = worker_connections(stats_port)
            return sorted(counts) == workers and all(n >= 1 for n in counts.values()) and counts
        counts = poll(each_holds_one, timeout=10, message="every worker holding a connection")
        assert sum(counts.values()) == 8, counts
        # Each holds its share (2), or one more when a connection waited past
        # the admission's grace under load (the mechanism's documented bound).
        per_worker = collections.Counter(pid for _, pid in held)
        assert sorted(per_worker) == workers and max(per_worker.values()) <= 3, per_worker
    finally:
        close_all(held)


def test_balance_survives_a_worker_kill_and_a_reload_with_no_connection_refused(run_server):
    server = run_server("-w", "4", "--stats", "127.0.0.1:0", "--graceful-timeout", "5")
    workers = server.wait_workers(4)
    stats_port = int(poll(lambda: STATS.search(server.log()), message="the stats line").group(1))
    poll(lambda: sum(worker_connections(stats_port).values()) == 0,
         message="the probes' connections to close")
    with Churn(server.port) as churn:
        held = hold(server.port, 8)
        try:
            victim = held[0][1]
            os.kill(victim, signal.SIGKILL)
            replacement = poll(lambda: set(server.children()) - set(workers),
                               message="a replacement worker").pop()
            poll(lambda: worker_connections(stats_port).get(replacement) == 0 and
                 len(worker_connections(stats_port)) == 4, message="the replacement to be ready")
            poll(lambda: sum(worker_connections(stats_port).values()) <= 6 + 1,
                 message="the killed worker's connections to be gone")
            # The others hold 2 each and the replacement none. A survivor may
            # still be waiting in accept() on a decision made before the kill
            # (8 open, so a 9th was its to take): the documented staleness of
            # one connection, so each survivor may take one more. Of 4 more
            # connections the replacement takes at least one.
            more = hold(server.port, 4)
            held += more
            assert replacement in [pid for _, pid in more], (replacement, more)
        finally:
            close_all(held)

        handovers = len(HANDED_OVER.findall(server.log()))
        server.signal(signal.SIGHUP)
        poll(lambda: len(HANDED_OVER.findall(server.log())) > handovers, timeout=60,
             message="the reload to finish")
        served = churn.served
        poll(lambda: churn.served > served + 20, message="the new generation to serve")
        after = hold(server.port, 8)
        try:
            pids = collections.Counter(pid for _, pid in after)
            assert len(pids) == 4 and not set(pids) & set(workers + [replacement]), pids
            assert max(pids.values()) <= 3, pids  # share 2, + 1 for a churn connection
        finally:
            close_all(after)
    assert churn.refused == [], churn.refused
    assert churn.served > 0
