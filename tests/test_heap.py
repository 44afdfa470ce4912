"""forkserve.memory.heap.share_heap(), in a child interpreter (it marks the whole heap)."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from test_share_heap_e2e import IMMORTAL, needs_immortal

CHILD = textwrap.dedent("""
    import datetime, gc, json, sys, weakref
    from forkserve.memory import heap
    from forkserve.memory._immortal import is_immortal

    RATE = 0.25                      # a float held by a module
    NAMES = ("alpha", "beta")        # an untracked tuple of str
    class Record:                    # a heap type, and an instance with a __dict__
        def total(self):
            return self.n * RATE
    record = Record()
    record.n = 10 ** 30              # a big int (not a cached small int)
    frame = sys._getframe()          # a frame object
    runtime = sys.intern("".join(["forkserve", " heap ", "test"]))  # interned at run time
    PLAIN = [bytearray(b"data"), datetime.date(2026, 12, 6),  # untracked C types, plain data
             datetime.datetime(2026, 12, 6, tzinfo=datetime.timezone.utc), object()]

    report = heap.share_heap()
    later = Record()
    gone = weakref.ref(later)
    del later
    marked = {name: is_immortal(value) for name, value in [
        ("function", Record.total), ("code", Record.total.__code__),
        ("code constant", Record.total.__code__.co_name), ("type", Record),
        ("module", sys.modules[__name__]), ("float", RATE), ("tuple", NAMES),
        ("tuple item", NAMES[0]), ("instance", record),
        ("big int", record.n), ("json module function", json.dumps),
        *[(type(value).__name__, value) for value in PLAIN]]}
    before = sys.getrefcount(record)
    copies = [record] * 100
    print(json.dumps({"objects": report.objects, "mb": report.bytes / 1e6, "marked": marked,
                      "frame": is_immortal(frame), "runtime interned": is_immortal(runtime),
                      "later freed": gone() is None, "frozen": gc.get_freeze_count() > 0,
                      "refcount moved": sys.getrefcount(record) != before}))
""")


def _child(env=None):
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                         timeout=120, env={**os.environ, **(env or {})})
    return out


@needs_immortal
def test_share_heap_marks_code_functions_types_modules_and_the_leaves_they_hold():
    out = _child()
    assert out.returncode == 0, out.stderr
    answer = json.loads(out.stdout)
    assert answer["objects"] > 10_000 and answer["mb"] > 1, answer
    assert answer["marked"] == {name: True for name in answer["marked"]}
    assert answer["frozen"] and not answer["refcount moved"]
    assert answer["later freed"]  # objects made afterwards are ordinary
    assert answer["frame"] is False
    if sys.version_info >= (3, 13):  # 3.12 makes every interned str immortal itself
        assert answer["runtime interned"] is False


@needs_immortal
def test_share_heap_is_refused_without_the_c_extension():
    from forkserve.memory import heap
    out = subprocess.run([sys.executable, "-c", "from forkserve.memory import heap; "
                          "print(heap.refusal())"], capture_output=True, text=True,
                         env={**os.environ, "FORKSERVE_NO_C": "1"}, timeout=60)
    assert "the C extension forkserve.memory._immortal is not built" in out.stdout
    assert heap.refusal() is None


@pytest.mark.skipif(IMMORTAL, reason="for Pythons without immortal objects")
def test_share_heap_refuses_without_immortal_objects():
    from forkserve.memory import heap
    reason = heap.refusal()
    assert "CPython 3.12 to 3.15" in reason and "forkserve.store.Store" in reason
    with pytest.raises(RuntimeError, match="needs immortal objects"):
        heap.share_heap()


@needs_immortal
def test_the_object_that_keeps_much_of_the_heap_mortal_is_named():
    """One ZoneInfo (in zoneinfo's weak cache: a weakref with a callback, so it
    stays mortal) held by 5,000 records keeps them and their list mortal."""
    out = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import zoneinfo
        from forkserve.memory import heap
        zone = zoneinfo.ZoneInfo("UTC")
        records = [{"name": f"person {n}", "zone": zone} for n in range(5_000)]
        report = heap.share_heap()
        print(report.leaders[0][0], report.leaders[0][1])
        print(report)
    """)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    leader, report = out.stdout.splitlines()
    what, kept = leader.rsplit(" ", 1)
    assert what == "zoneinfo.ZoneInfo(key='UTC')" and 5_001 <= int(kept) < 5_100, leader
    assert f"most of them kept by zoneinfo.ZoneInfo(key='UTC') {int(kept):,}" in report


@needs_immortal
def test_keep_mortal_keeps_an_object_or_a_modules_globals_and_their_data_mortal():
    out = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import json, sys, types
        import forkserve
        from forkserve.memory import heap
        from forkserve.memory._immortal import is_immortal

        class Holder:
            def __init__(self):
                self.cache = {"rows": [[1.5], [2.5]]}
        kept, other = forkserve.keep_mortal(Holder()), Holder()
        module = types.ModuleType("kept_module")
        exec("data = {'rows': [[3.5]]}\\ndef f(): return data", module.__dict__)
        sys.modules["kept_module"] = forkserve.keep_mortal(module)
        heap.share_heap()
        print(json.dumps({
            "kept": [is_immortal(x) for x in (kept, kept.cache, kept.cache["rows"][0])],
            "other": [is_immortal(x) for x in (other, other.cache, other.cache["rows"][0])],
            "module": [is_immortal(x) for x in (module.__dict__, module.data,
                                                module.data["rows"], module.f, module)]}))
    """)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"kept": [False, False, False], "other": [True, True, True],
                                      "module": [False, False, False, True, True]}
