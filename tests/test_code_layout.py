"""forkserve.memory.code_layout.pack_writers(), in a child interpreter (it
rewrites functions' code for good), and the warm-up recording it replays."""

import json
import subprocess
import sys
import textwrap

import pytest

from forkserve.process import warmup

needs_specialisation = pytest.mark.skipif(sys.version_info < (3, 12),
                                          reason="code_layout runs with --share-heap (3.12+)")

CHILD = textwrap.dedent("""
    import gc, json, sys
    from forkserve.memory import code_layout

    gc.disable()
    junk = []
    class A: x = 1
    class B: y = 2; x = 3
    class C: x = 4
    KINDS = [A(), B(), C(), 1, "s", (1,), 2.0, None]   # one attribute site, many types

    def define(n, filler=0):
        junk.extend(bytes(filler) for _ in range(40))  # code-sized objects between the codes
        space = {"KINDS": KINDS}
        exec(f"def writer_{n}(k):\\n    return getattr(k, 'x', 0) + len(str(k.__class__))\\n"
             f"def settled_{n}(a):\\n    return a + 1\\n", space)
        return space[f"writer_{n}"], space[f"settled_{n}"]

    filler = sys.getsizeof(define(999)[0].__code__) - sys.getsizeof(b"")
    pairs = [define(n, filler) for n in range(200)]      # scattered among the filler
    del junk[::40]                                       # and a hole of their size between each

    def factory():
        def inner(k):
            return getattr(k, "x", 0)
        return inner

    def warm():
        for writer, settled in pairs:
            for kind in KINDS:
                writer(kind)
            settled(1)
        made = factory()
        for kind in KINDS:
            made(kind)

    for _ in range(3):
        warm()
    writers = [w for w, _ in pairs]
    old = [w.__code__ for w in writers]
    answers = [w(kind) for w in writers for kind in KINDS]
    settled_old = [s.__code__ for _, s in pairs]
    inner_old = factory().__code__
    packed = code_layout.pack_writers(warm)
    new = [w.__code__ for w in writers]
    pages = lambda codes: len({id(c) // 4096 for c in codes})
    print(json.dumps({
        "moved": packed.moved, "writers": packed.writers, "functions": packed.functions,
        "writers_copied": sum(n is not o for n, o in zip(new, old)),
        "equal": all(n == o for n, o in zip(new, old)),
        "settled_kept": all(s.__code__ is o for (_, s), o in zip(pairs, settled_old)),
        "same_answers": answers == [w(kind) for w in writers for kind in KINDS],
        "factory_copied": factory().__code__ is not inner_old,
        "pages_before": pages(old), "pages_after": pages(new)}))
""")


@needs_specialisation
def test_code_that_kept_writing_is_copied_onto_few_pages_and_still_runs():
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["writers_copied"] == 200, result
    assert result["equal"] and result["settled_kept"], result
    assert result["same_answers"], result
    assert result["factory_copied"], "a writer nested in a function moves with its parent"
    assert result["pages_before"] >= 150, "the test's writers start scattered"
    assert result["pages_after"] <= 40, result


def test_recording_collects_the_requests_clients_make_and_replay_makes_them_again():
    seen = []

    def app(environ, start_response):
        seen.append((environ["REQUEST_METHOD"], environ["PATH_INFO"],
                     environ.get("HTTP_COOKIE")))
        start_response("200 OK", [("Set-Cookie", f"n={len(seen)}")])
        return [b"ok"]

    client = warmup.Client(app)
    with warmup.recording() as requests:
        client.get("/a")
        client.post("/b", {"k": "v"})
    client.get("/outside")  # not recorded
    assert [(method, path) for _, method, path, _, _ in requests] == [("GET", "/a"),
                                                                     ("POST", "/b")]
    warmup.replay(requests)
    # made again through the same client, with its cookies as they are now
    assert seen[-2:] == [("GET", "/a", "n=3"), ("POST", "/b", "n=4")]
