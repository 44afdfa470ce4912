"""forkserve.memory.free_space: a worker forked after before_fork() allocates
nothing in the holes the master left, in pymalloc's pools or in glibc's heap.

Each case runs in a child interpreter (it allocates for good) that makes
holes, takes them or not, forks, and lists where the fork's new objects
landed; the case without the take shows the test can tell the difference.
"""

import json
import subprocess
import sys
import textwrap

import pytest

from forkserve.memory import free_space

needs_extension = pytest.mark.skipif(free_space._extension() is None,
                                     reason="forkserve.memory._free_space is not built")

CHILD = textwrap.dedent("""
    import gc, json, os, sys
    from forkserve.memory import free_space

    gc.disable()
    SIZE, TAKE = int(sys.argv[1]), sys.argv[2] == "take"
    objects = [bytes(SIZE) for _ in range(4000)]     # bytes(n) is one allocation each
    holes = {id(o) for o in objects[::2]}
    del objects[::2]                                  # every other one freed: holes
    taken = free_space.before_fork() if TAKE else None
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:
        new = [bytes(SIZE) for _ in range(2000)]
        landed = sum(id(o) in holes for o in new)
        os.write(writer, json.dumps({"landed": landed}).encode())
        os._exit(0)
    os.close(writer)
    answer = json.loads(os.read(reader, 1000))
    os.waitpid(pid, 0)
    answer["taken"] = taken and [taken.pool_bytes, taken.heap_bytes]
    print(json.dumps(answer))
""")


def _fork_after(size, take):
    out = subprocess.run([sys.executable, "-c", CHILD, str(size), take], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@needs_extension
@pytest.mark.parametrize("size,where", [(100, "pymalloc pools"), (3000, "glibc heap")])
def test_a_forked_worker_allocates_nothing_in_the_masters_holes(size, where):
    untaken = _fork_after(size, "no")
    assert untaken["landed"] > 500, f"without the take the fork fills the holes ({where})"
    taken = _fork_after(size, "take")
    assert taken["landed"] == 0, taken
    pool_bytes, heap_bytes = taken["taken"]
    assert (pool_bytes if size <= 512 else heap_bytes) >= 2000 * size


@needs_extension
def test_takes_after_the_first_stop_at_the_respawn_budget(monkeypatch):
    class State:
        first = None
        since_first = 0
    first = free_space.before_fork(State)
    assert first is not None and State.first == first
    monkeypatch.setattr(free_space, "RESPAWN_BUDGET", 1)
    garbage = [bytes(100) for _ in range(1000)]
    del garbage[::2]
    second = free_space.before_fork(State)
    assert second is not None and State.since_first == second.total > 0
    assert free_space.before_fork(State) is None  # the budget is spent: nothing more is taken


def test_without_the_extension_a_fork_goes_ahead(monkeypatch):
    monkeypatch.setattr(free_space, "_extension", lambda: None)
    assert free_space.before_fork() is None
