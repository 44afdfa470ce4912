"""The compatibility matrix of heap sharing: objects made at import that own
something, served with sharing (the default) and without, must behave the
same, but for the one difference docs/memory.md states (a container made at
import, not kept mortal, filled and replaced by a worker). tests/apps/compat_matrix.py makes them; each is used by a request and
dropped by another, and what a user can observe (open descriptors, files,
finally blocks, weakref caches, answers) is compared between the two servers.
"""

import pytest

from test_share_heap_e2e import SHARED, needs_immortal

pytestmark = pytest.mark.e2e

pytest.importorskip("sqlalchemy")
pytest.importorskip("requests")

CASES = ("sqlalchemy", "logging", "tempfile", "subprocess", "requests", "weakvalue",
         "generator", "context", "lru_cache", "memoryview", "traceback", "greenlet",
         "generator_new", "weakref", "cache")

#: What dropping each object leaves, as Python does it without sharing.
DROPPED = {
    "sqlalchemy": "db fds 1 then 0 after dispose()",
    "logging": "log fds 0",
    "tempfile": "exists False",
    "subprocess": "pipe closed",
    "requests": "dropped",
    "weakvalue": "cached []",
    "generator": "new events ['generator finally']",
    "context": "new events ['context left']",
    "lru_cache": "fds 0, on disk \"written by the lru_cache's file\"",
    "memoryview": "resized: b'exported then resized'",
    "traceback": "fds 0, on disk \"written by the traceback's frame\"",
    "greenlet": "new events ['greenlet finally']",
    "generator_new": "new events ['generator finally']",
    "weakref": "referent None",
    "cache": "new events ['cache entry freed']",
}


def _answers(run_server, tmp_path, *flags):
    data = tmp_path / ("shared" if not flags else "not-shared")
    data.mkdir()
    server = run_server(*flags, "-w", "1", app="compat_matrix:app", env={"DATA_DIR": str(data)})
    answers = {}
    for case in CASES + ("cache_unkept",):
        for step in ("use", "drop"):
            status, body = server.get(f"/{step}/{case}")
            assert status == 200, (case, step, body)
            answers[step, case] = body
    return server, answers


@needs_immortal
def test_objects_made_at_import_behave_the_same_with_and_without_sharing(run_server, tmp_path):
    control, unshared = _answers(run_server, tmp_path, "--no-share-heap")
    assert not SHARED.search(control.log())
    assert {case: unshared["drop", case] for case in CASES} == DROPPED  # the control works
    server, shared = _answers(run_server, tmp_path)
    assert SHARED.search(server.log()), server.log()
    differing = {key: (unshared[key], shared[key]) for key in unshared
                 if unshared[key] != shared[key]}
    # The documented exception: a container made at import and not kept mortal
    # keeps what a worker put into it after the worker replaces it.
    unkept = ("drop", "cache_unkept")
    assert differing == {unkept: ("new events ['cache entry freed']", "new events []")}
