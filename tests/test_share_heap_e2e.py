"""Heap sharing (on by default, --share-heap to insist, --no-share-heap to turn
it off): the setting on each Python, and what an immortal master heap means.

Immortal objects are never freed, so the objects whose death runs code stay
mortal. These tests show, on the real server, that nothing a user can see
changes: the master's finalisers, weakref callbacks and generators' finally
blocks run in the worker that drops them, as without sharing; a worker's own
objects are ordinary (finalised, collected, its memory does not grow); a
file or socket opened in the master closes when a worker closes it; a
reload (HUP) still frees the old heap, because the old processes exit.
"""

import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from forkserve import exits
from forkserve.memory import sharing
from forkserve_testing import poll
from test_reload_e2e import _reload_to, _rss

pytestmark = pytest.mark.e2e

IMMORTAL = sharing.immortal_supported()
needs_immortal = pytest.mark.skipif(not IMMORTAL,
                                    reason="heap sharing needs CPython 3.12-3.15 (checked)")
SHARED = re.compile(r"Heap sharing: shared ([\d,]+) objects \(([\d,.]+) MB\) in ([\d.]+) s")


@pytest.mark.skipif(IMMORTAL, reason="the refusal is for Pythons without immortal objects")
def test_share_heap_is_refused_at_start_without_immortal_objects(run_server):
    server = run_server("--share-heap", "-w", "2", wait=False)
    assert server.wait_exit() == exits.CONFIG_ERROR
    log = server.log()
    assert "--share-heap needs immortal objects" in log
    assert "CPython 3.12 to 3.15" in log and "forkserve.store.Store" in log
    assert "Listening at" not in log


@pytest.mark.skipif(IMMORTAL, reason="the log line is for Pythons without checked marking")
def test_by_default_without_immortal_objects_the_server_says_so_and_serves(run_server):
    server = run_server("-w", "1")
    assert "Heap sharing off: " in server.log()
    assert server.get("/pid")[0] == 200


@needs_immortal
@pytest.mark.parametrize("flags", [(), ("--share-heap",)], ids=["default", "--share-heap"])
def test_the_heap_is_shared_by_default_and_workers_serve(run_server, flags):
    server = run_server(*flags, "-w", "2")
    match = SHARED.search(server.log())
    assert match, server.log()
    assert int(match.group(1).replace(",", "")) > 10_000  # the whole heap, not a dataset
    assert float(match.group(2).replace(",", "")) > 1
    server.wait_workers(2)
    assert server.get("/pid")[0] == 200


@needs_immortal
def test_share_heap_with_no_workers_says_it_is_pointless_and_serves(run_server):
    server = run_server("--share-heap", "-w", "0")
    assert "--share-heap: skipped, pointless with -w 0" in server.log()
    assert not SHARED.search(server.log())
    assert server.get("/pid")[0] == 200


@needs_immortal
def test_the_probe_runs_none_of_the_applications_at_fork_hooks(run_server, tmp_path):
    """Each hook sleeps 5 s: had the probe forked with os.fork, the master
    would have slept in the before and after-in-parent hooks before listening,
    and the file would show calls the worker's fork did not make."""
    server = run_server("-w", "1", app="fork_hooks:app", env={"WITNESS_DIR": str(tmp_path)},
                        timeout=60)
    assert SHARED.search(server.log()), server.log()
    worker = int(server.get("/", timeout=30)[1])
    calls = sorted((tmp_path / "hooks").read_text().splitlines())
    assert calls == [f"before {server.pid}", f"child {worker}", f"parent {server.pid}"]


@needs_immortal
def test_a_server_whose_at_fork_hook_blocks_until_the_heap_is_shared_serves_at_once(
        run_server, tmp_path):
    """The app's os.register_at_fork(before=...) hook sleeps 60 s in any fork
    made before the heap is shared (tests/apps/probe_blocking_hook.py tells by
    whether a list of its own is immortal yet). Only the probe forks then:
    forkserve forks its workers after sharing, and for them the hook runs and
    returns at once. So the wait isolated here is the probe's. Had the probe
    forked with os.fork, the master would sleep 60 s in the hook before any
    worker existed; the server must answer within 15 s of starting instead,
    with the heap shared (the probe passed)."""
    started = time.monotonic()
    server = run_server("-w", "1", app="probe_blocking_hook:app", wait=False,
                        env={"WITNESS_DIR": str(tmp_path)})

    def answered():
        try:
            return server.get("/", timeout=2)
        except OSError:  # not yet listening, or no worker yet
            return None
    server.wait_listening(timeout=15)
    status, worker = poll(answered, timeout=max(0.0, started + 15 - time.monotonic()),
                          interval=0.1, message="an answer within 15 s of the start")
    assert status == 200
    assert SHARED.search(server.log()), server.log()
    # The hook did run, in the master, for the worker's fork only, after sharing.
    assert (tmp_path / "hooks").read_text().splitlines() == [f"before {server.pid} shared"]
    assert int(worker) != server.pid


def test_a_failed_probe_is_a_warning_that_says_what_to_do_and_refuses_share_heap(tmp_path):
    """The probe cannot fork (no descriptor left for its pipe): the default
    warns, with what to do, and an explicit --share-heap is refused."""
    script = tmp_path / "nofds.py"
    script.write_text(textwrap.dedent("""
        import logging, resource
        from forkserve.memory import heap, sharing
        sharing.accelerator(), sharing.unchecked_reason()  # their imports, while files open
        held = []
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
        try:
            while True:
                held.append(open("/dev/null"))
        except OSError:
            pass
        level, message = heap.off_message()
        refusal = heap.refusal()
        del held
        print(logging.getLevelName(level))
        print(message)
        print(refusal)
    """))
    level, message, refusal = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, check=True,
        env={**os.environ, "PYTHONWARNINGS": "ignore"}).stdout.splitlines()
    if not IMMORTAL:  # this Python cannot share: the probe never runs, and it is no fault
        assert level == "INFO"
        return
    assert level == "WARNING"
    cause = "the probe could not fork a child: Too many open files"
    assert message.startswith(f"Heap sharing off: the immortality probe failed ({cause})")
    assert "--no-share-heap" in message and "Restart" in message
    assert refusal.startswith("--share-heap needs immortal objects") and cause in refusal


def _safety_server(run_server, tmp_path, *flags, wait=True, **env):
    witness = tmp_path / "witness"
    witness.mkdir()
    server = run_server(*flags, "-w", "1", app="heap_safety:app", wait=wait,
                        env={"WITNESS_DIR": str(witness), **env})
    return server, witness


def _events(witness, pid):
    return sorted(p.name.rsplit("-", 1)[0] for p in witness.iterdir()
                  if p.name.endswith(f"-{pid}"))


MASTER_EVENTS = ["generator-finally", "master-del", "nested-del", "weakref-callback"]


def test_without_sharing_a_worker_runs_the_master_objects_finalisers(run_server, tmp_path):
    """The control: shows the next test could see every finaliser run."""
    server, witness = _safety_server(run_server, tmp_path, "--no-share-heap")
    assert not SHARED.search(server.log())
    worker = int(server.get("/pid")[1])
    assert server.get("/drop") == (200, "dropped")
    assert _events(witness, worker) == MASTER_EVENTS


@needs_immortal
def test_with_sharing_the_master_objects_finalisers_run_in_the_worker_that_drops_them(
        run_server, tmp_path):
    server, witness = _safety_server(run_server, tmp_path, "--log-level", "debug")
    log = server.log()
    assert SHARED.search(log), log
    kept = re.search(r"kept mortal, so their finalisers still run: ([\d,]+) objects", log)
    assert kept and int(kept.group(1).replace(",", "")) > 0, log
    assert "heap_safety.Finalised" in log
    worker = int(server.get("/pid")[1])
    assert server.get("/drop") == (200, "dropped")
    assert server.get("/mine") == (200, "made and dropped")
    # As without sharing, and the worker's own object, in a cycle, by its collector.
    assert _events(witness, worker) == sorted(MASTER_EVENTS + ["worker-del"])
    server.signal(signal.SIGTERM)
    assert server.wait_exit() == 0
    # None ran in the master, which never dropped them (it exits with os._exit).
    assert not [p.name for p in witness.iterdir() if p.name.endswith(f"-{server.pid}")]


@needs_immortal
def test_a_file_and_socket_opened_in_the_master_close_when_a_worker_closes_them(
        run_server, tmp_path):
    server, _ = _safety_server(run_server, tmp_path, "--share-heap")
    status, body = server.get("/close")
    assert status == 200, body
    pid, socket_link, file_closed, socket_fd = body.split()
    assert (file_closed, socket_fd) == ("True", "-1")
    app_file = os.path.join(os.path.dirname(__file__), "apps", "heap_safety.py")

    def links(process):
        names = os.listdir(f"/proc/{process}/fd")
        return {os.readlink(f"/proc/{process}/fd/{n}") for n in names
                if os.path.exists(f"/proc/{process}/fd/{n}")}
    assert app_file not in links(pid) and socket_link not in links(pid)
    # The master's own copies stay open: the worker closed its descriptors.
    assert app_file in links(server.pid) and socket_link in links(server.pid)


@needs_immortal
def test_a_workers_own_garbage_is_collected_and_its_memory_does_not_grow(
        run_server, tmp_path):
    from forkserve.memory import procfs
    server, _ = _safety_server(run_server, tmp_path, "--share-heap")
    worker = int(server.get("/pid")[1])
    for _ in range(40):  # warm up: the worker's arenas and caches reach their size
        assert server.get("/churn?n=2000")[0] == 200
    before = procfs.read_process(worker).private
    for _ in range(400):  # 800,000 records with cycles, about 1 GiB if none were freed
        assert server.get("/churn?n=2000")[0] == 200
    after = procfs.read_process(worker).private
    assert int(server.get("/pid")[1]) == worker
    assert after - before < 8 * 2**20, (before, after)


@needs_immortal
def test_with_share_heap_a_worker_runs_full_collections_by_default(run_server, tmp_path):
    """Old-generation cyclic garbage is the worker's own: with the master's
    heap immortal and frozen, the default collects it (--worker-gc auto)."""
    server, _ = _safety_server(run_server, tmp_path, "--share-heap")
    for _ in range(60):  # cycles enough to promote some to generation 2 and collect it
        assert server.get("/churn?n=2000")[0] == 200
    threshold, full = map(int, server.get("/gcstats")[1].split())
    assert threshold == 10 and full > 0, (threshold, full)


@needs_immortal
def test_hup_with_share_heap_ends_the_old_processes_and_frees_the_old_heap(
        run_server, tmp_path):
    version_file = tmp_path / "version"
    version_file.write_text("v1")
    server = run_server("--share-heap", "-w", "2", app="versioned:app",
                        env={"VERSION_FILE": str(version_file), "BALLAST_MB": "150"})
    old_workers = poll(lambda: len(server.children()) == 2 and server.children(),
                       message="two workers")
    assert SHARED.search(server.log())
    assert _rss(server.pid) > 150 * 2**20  # the master holds the immortal "dataset"
    _reload_to(server, version_file, "v2")
    poll(lambda: not any(os.path.exists(f"/proc/{pid}") for pid in old_workers),
         message="the old workers to exit")
    # Same pid, but the exec into the supervisor released the immortal heap.
    poll(lambda: _rss(server.pid) < 75 * 2**20, message="the master's RSS to drop")
    assert server.get("/")[1].startswith("v2")
    assert len(SHARED.findall(server.log())) == 2  # the new generation shared its own heap


def test_warmup_requests_are_served_by_the_master_before_it_forks(run_server, tmp_path):
    server, witness = _safety_server(run_server, tmp_path, "--warmup", "/witness",
                                     "--warmup", "/nowhere")
    assert (witness / f"request-{server.pid}").exists()
    log = server.log()
    assert "--warmup: /nowhere answered 404 Not Found" in log
    assert "--warmup: 6 requests (3 x 200, 3 x 404)" in log
    assert log.index("--warmup: 6 requests") < log.index("Listening at")


def test_a_warmup_request_that_raises_stops_the_start(run_server, tmp_path):
    server, _ = _safety_server(run_server, tmp_path, "--warmup", "/raise", wait=False)
    assert server.wait_exit() == exits.APP_LOAD_ERROR
    assert "RuntimeError: raised on purpose by a test" in server.log()
    assert "--warmup: GET /raise raised" in server.log()
    assert "Listening at" not in server.log()


def test_warmup_takes_only_url_paths(run_server, tmp_path):
    server = run_server("--warmup", "products", wait=False)
    assert server.wait_exit() == exits.CONFIG_ERROR
    assert "'products' is not a URL path; give one that starts with /" in server.log()


@pytest.mark.parametrize("workers", ["1", "0"])
def test_a_serving_process_imports_nothing_after_the_heap_is_shared(run_server, workers):
    """Every module a worker (or -w 0) runs is imported before the master
    shares its heap and freezes it: one imported later stays mortal, and each
    worker copies the pages its reference counts are on. The app answers
    with what its process imported since the post_freeze hook."""
    server = run_server("-w", workers, "-c", "late_imports.conf.py", app="late_imports:app")
    for _ in range(2):  # the second answers after a whole request has been served
        status, late = server.get("/")
        assert status == 200
    assert late == "", f"imported after the heap was shared: {late.split()}"
