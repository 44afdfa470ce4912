"""forkserve.memory.free_space: a worker forked after before_fork() allocates
nothing in the holes the master left, in pymalloc's pools or in glibc's heap;
the take is bounded, checked at run time, and can be turned off.

The takes run in child interpreters (they allocate for good) that make
holes, take them or not, fork, and list where the fork's new objects
landed; the case without the take shows the test can tell the difference.
The allocators a take refuses are tested on real servers: under -X dev,
PYTHONMALLOC=malloc and an LD_PRELOADed jemalloc (Debian's libjemalloc2).
"""

import glob
import json
import os
import subprocess
import sys
import textwrap

import pytest

from forkserve.config import settings
from forkserve.memory import free_space
from forkserve.memory.free_space import Allocators
from forkserve_testing import missing

needs_extension = pytest.mark.skipif(free_space._extension() is None,
                                     reason="forkserve.memory._free_space is not built")

CHILD = textwrap.dedent("""
    import gc, json, logging, os, sys
    from forkserve.memory import free_space

    logging.basicConfig(stream=sys.stderr, level=logging.DEBUG, format="%(message)s")
    gc.disable()
    SIZE, TAKE = int(sys.argv[1]), sys.argv[2] == "take"
    if len(sys.argv) > 3:
        free_space.BUDGET = int(sys.argv[3])
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


def _fork_after(size, take, *budget, flags=(), env=None):
    out = subprocess.run([sys.executable, *flags, "-c", CHILD, str(size), take, *map(str, budget)],
                         capture_output=True, text=True, timeout=60,
                         env=dict(os.environ, **(env or {})))
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout), out.stderr


@needs_extension
@pytest.mark.parametrize("size,where", [(100, "pymalloc pools"), (3000, "glibc heap")])
def test_a_forked_worker_allocates_nothing_in_the_masters_holes(size, where):
    untaken, _ = _fork_after(size, "no")
    assert untaken["landed"] > 500, f"without the take the fork fills the holes ({where})"
    taken, _ = _fork_after(size, "take")
    assert taken["landed"] == 0, taken
    pool_bytes, heap_bytes = taken["taken"]
    assert (pool_bytes if size <= 512 else heap_bytes) >= 2000 * size


@needs_extension
@pytest.mark.parametrize("size,budget", [(100, 2 ** 16), (3000, 2 ** 20)])
def test_the_first_take_stops_at_the_budget(size, budget):
    taken, _ = _fork_after(size, "take", budget)  # holes of 2000 x size: 0.2 and 6 MB
    assert 0 < sum(taken["taken"]) <= budget, taken
    assert taken["landed"] > 0  # what the budget left is still a hole


TAKES = textwrap.dedent("""
    import gc, json, logging, sys
    from forkserve.memory import free_space

    logging.basicConfig(stream=sys.stderr, level=logging.DEBUG, format="%(message)s")
    gc.disable()
    free_space.BUDGET = int(sys.argv[1])
    if sys.argv[2] == "pretend-pymalloc":  # past the run-time check, to test the one after
        free_space.read_allocators = lambda: free_space.Allocators(True)
    takes = []
    for _ in range(4):
        garbage = [bytes(100) for _ in range(20000)]
        del garbage[::2]
        taken = free_space.before_fork()
        takes.append(taken and taken.total)
    print(json.dumps(takes))
""")


def _takes(budget, mode="", flags=()):
    out = subprocess.run([sys.executable, *flags, "-c", TAKES, str(budget), mode],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout), out.stderr


@needs_extension
def test_takes_after_the_first_stop_at_the_budget():
    takes, _ = _takes(2 ** 20)  # each take is offered 1 MB of holes
    first, *later = takes
    assert 0 < first <= 2 ** 20 and later[0] > 0
    assert 2 ** 19 < sum(take or 0 for take in later) <= 2 ** 20, takes


@needs_extension
def test_a_take_that_misses_the_free_blocks_it_counted_says_so_and_stops():
    # Under the debug hooks each block is padded into another size class: the
    # run-time check refuses that; pretending it passed shows the take checks itself.
    takes, log = _takes(2 ** 30, "pretend-pymalloc", flags=("-X", "dev"))
    assert takes[0] > 0 and takes[1:] == [None, None, None], takes
    assert log.count("did not go as pymalloc's statistics said") == 1, log
    assert "no more takes in this master" in log and "--no-take-free-space" in log


@needs_extension
def test_no_take_while_tracemalloc_traces():
    taken, log = _fork_after(100, "take", env={"PYTHONTRACEMALLOC": "1"})
    assert taken["taken"] is None
    assert "Not taking the allocators' free space before forking workers: tracemalloc is " \
        "tracing" in log, log


# -- the run-time checks, decided without I/O -----------------------------------------

@pytest.mark.parametrize("allocators,says", [
    (Allocators(extension=False), "forkserve.memory._free_space is not built"),
    (Allocators(True, tracing=True), "tracemalloc is tracing"),
    (Allocators(True, allocator="pymalloc_debug"), "debug memory hooks are on (-X dev"),
    (Allocators(True, allocator="malloc"), "PYTHONMALLOC=malloc"),
    (Allocators(True, allocator="other"), "not plain pymalloc"),
    (Allocators(True, glibc_malloc=False), "an LD_PRELOADed jemalloc or tcmalloc"),
])
def test_refusal_says_which_check_failed(allocators, says):
    assert says in free_space.refusal(allocators)


def test_plain_pymalloc_and_glibc_are_not_refused():
    assert free_space.refusal(Allocators(True)) is None


@needs_extension
def test_this_process_reads_its_own_allocators():
    # the suite runs without PYTHONMALLOC, -X dev or an LD_PRELOADed malloc
    assert free_space.read_allocators() == Allocators(True, "pymalloc", False, True)


def test_the_switch_is_on_unless_turned_off_by_flag_environment_or_config(tmp_path):
    assert settings.parse(["app:app"], environ={}).take_free_space is True
    assert settings.parse(["--no-take-free-space", "app:app"], environ={}).take_free_space \
        is False
    assert settings.parse(["app:app"], environ={"FORKSERVE_TAKE_FREE_SPACE": "0"}) \
        .take_free_space is False
    config = tmp_path / "forkserve.conf.py"
    config.write_text("take_free_space = False\n")
    assert settings.parse(["-c", str(config), "app:app"], environ={}).take_free_space is False


def test_turned_off_nothing_is_checked_or_taken(monkeypatch):
    monkeypatch.setattr(free_space, "read_allocators", lambda: pytest.fail("checked"))
    assert free_space.before_fork(False) is None


# -- real servers ---------------------------------------------------------------------

SKIPPED = "Not taking the allocators' free space before forking workers: "
TOOK = "Took the free space between the master's objects before the first fork"

JEMALLOC_MISSING = ("Debian's libjemalloc2 is not installed; this test preloads it. Install it "
                    "with `apt-get update && apt-get install -y libjemalloc2` (.ci/run does "
                    "this in CI)")


def _jemalloc():
    """The path of libjemalloc.so.2: skip without it, fail in CI (CI=true)."""
    found = glob.glob("/usr/lib/*/libjemalloc.so.2") + glob.glob("/usr/lib/libjemalloc.so.2")
    if not found:
        missing(pytest, JEMALLOC_MISSING)
    return found[0]


def _served(run_server, *args, **kwargs):
    server = run_server("-w", "2", "--log-level", "debug", *args, **kwargs)
    server.wait_workers(2)
    return server.log()


@needs_extension
@pytest.mark.e2e
@pytest.mark.parametrize("how,says", [
    (dict(python_flags=("-X", "dev")), "Python's debug memory hooks are on (-X dev"),
    (dict(env={"PYTHONMALLOC": "malloc"}), "pymalloc is not the object allocator "
                                           "(PYTHONMALLOC=malloc)"),
    ("jemalloc", "malloc() is not glibc's (an LD_PRELOADed jemalloc"),
], ids=["-X dev", "PYTHONMALLOC=malloc", "LD_PRELOAD=libjemalloc.so.2"])
def test_a_server_skips_the_take_with_one_log_line_where_it_cannot_be_trusted(
        run_server, how, says):
    if how == "jemalloc":
        how = dict(env={"LD_PRELOAD": _jemalloc()})
    log = _served(run_server, **how)
    assert log.count(SKIPPED) == 1, log  # two forks, one line
    line = next(line for line in log.splitlines() if SKIPPED in line)
    assert says in line and "--no-take-free-space (take_free_space = False) silences this" \
        in line, line
    assert TOOK not in log


@needs_extension
@pytest.mark.e2e
def test_a_server_takes_by_default_and_not_with_no_take_free_space(run_server):
    assert TOOK in _served(run_server)
    log = _served(run_server, "--no-take-free-space")
    assert TOOK not in log and SKIPPED not in log, log


def test_a_missing_jemalloc_skips_with_how_to_install_it_and_fails_in_ci(monkeypatch):
    monkeypatch.setattr(glob, "glob", lambda pattern: [])
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="apt-get install -y libjemalloc2"):
        _jemalloc()
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="apt-get install -y libjemalloc2"):
        _jemalloc()
