"""Recycling under load (issue 45): workers replaced by --max-requests while
keep-alive clients and clients with a connection per request keep asking
lose no request, and the workers are replaced one at a time, each only once
its replacement serves (forkserve.process.lifecycle decides; these tests
check the real processes carry it out)."""

import http.client
import re
import time

import pytest

from forkserve_testing import ClientThreads, poll
from test_keepalive_e2e import KeepAliveClients

pytestmark = pytest.mark.e2e

_EVENT = re.compile(r"Worker (\d+) \(pid (\d+)\) is (recycled|replaced)(.*)"
                    r"|Booting worker (\d+) with pid: (\d+)")


class OneShotClients(ClientThreads):
    """`threads` clients sending each request on a new connection
    (`Connection: close`), counting failures, never retrying."""

    def __init__(self, port, threads=4, seconds=240):
        self.port, self.deadline = port, time.monotonic() + seconds
        self.answered = 0
        self.failures = []
        super().__init__(threads)

    def run(self):
        while not self.stop.is_set() and time.monotonic() < self.deadline:
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=15)
            try:
                conn.request("GET", "/pid", headers={"Connection": "close"})
                response = conn.getresponse()
                response.read()
                if response.status == 200:
                    self.answered += 1
                else:
                    self.failures.append(response.status)
            except (http.client.HTTPException, OSError) as exc:
                self.failures.append(repr(exc))
            finally:
                conn.close()


def recycles(log):
    """[(number, old pid, replacement pid)] in the order the recycles ended;
    asserts from the log's order that one ran at a time and that each old
    worker was told to drain only once its replacement said it serves."""
    under_way, booted, done = {}, {}, []
    for event in _EVENT.finditer(log):
        number, pid, what, rest, booting, new_pid = event.groups()
        if booting:
            booted[int(booting)] = int(new_pid)
        elif what == "recycled":
            # a second one only after the first's replacement took 5 s to say it serves
            assert not under_way or "has not said it serves" in rest, (under_way, event[0])
            under_way[int(number)] = int(pid)
            booted.pop(int(number), None)
        else:
            assert int(number) in booted, f"worker {number} (pid {pid}) told to drain before " \
                                          "its replacement served"
            assert under_way.pop(int(number)) == int(pid)
            done.append((int(number), int(pid), booted.pop(int(number))))
    return done


def test_recycles_under_load_lose_no_request_and_replace_one_worker_at_a_time(run_server):
    server = run_server("-w", "3", "--max-requests", "150", "--graceful-timeout", "10")
    server.wait_workers(3)
    with KeepAliveClients(server.port, threads=6) as kept, \
            OneShotClients(server.port, threads=3) as oneshot:
        poll(lambda: len(recycles(server.log())) >= 12, timeout=180,
             message="12 --max-requests recycles")
    assert kept.failures == [] and oneshot.failures == [], (kept.failures[:5],
                                                            oneshot.failures[:5])
    done = recycles(server.log())
    assert {number for number, _, _ in done} == {1, 2, 3}
    print(f"0 lost of {kept.total} kept-alive and {oneshot.answered} one-shot requests "
          f"across {len(done)} recycles")
    assert kept.total > 0 and oneshot.answered > 0
    # every worker that asked is replaced once the load stops: a recycle queued
    # behind another is not forgotten
    asked = lambda: {int(p) for p in re.findall(r"\[(\d+)\] \[INFO\] worker \d+ served \d+ "
                                                r"requests \(--max-requests\)", server.log())}
    poll(lambda: asked() <= {pid for _, pid, _ in recycles(server.log())}, timeout=30,
         message="every worker that asked to be replaced")
