"""threading.local per greenlet in C (forkserve.process.greenlet_local).

The behaviour checks run on gevent's local and on forkserve's alike: the
C one must do what the class it replaces does. Then install() in a fresh
interpreter (monkey-patching is for the whole process), and a real worker
whose concurrent requests each keep their own value.
"""

import gc
import os
import subprocess
import sys
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor

import gevent
import greenlet
import gevent.event
import gevent.local
import pytest

from forkserve.config import settings
from forkserve.process import greenlet_local
from forkserve_testing import poll

C_LOCAL, WHY_NOT = greenlet_local.c_local()
if C_LOCAL is not None:
    from forkserve.process._greenlet_local import greenlets
GEVENT_LOCAL = f"{gevent.local.local.__module__}.{gevent.local.local.__qualname__}"
needs_c = pytest.mark.skipif(C_LOCAL is None, reason=f"no C local: {WHY_NOT}")
KINDS = [pytest.param(gevent.local.local, id="gevent"),
         pytest.param(C_LOCAL, id="c", marks=needs_c)]


class Value:
    """Something a weak reference can watch."""


def in_greenlet(function, *args):
    greenlet = gevent.spawn(function, *args)
    greenlet.join()
    return greenlet.get()


@pytest.mark.parametrize("local", KINDS)
def test_each_greenlet_sees_only_its_own_attributes(local):
    shared = local()
    shared.name = "main"
    step = gevent.event.Event()

    def keep(name):
        assert not hasattr(shared, "name")
        assert shared.__dict__ == {}
        shared.name = name
        step.wait()  # the others set theirs meanwhile
        return shared.name, dict(shared.__dict__)

    greenlets = [gevent.spawn(keep, f"g{n}") for n in range(3)]
    gevent.sleep(0)
    step.set()
    gevent.joinall(greenlets)
    assert [g.get() for g in greenlets] == [(f"g{n}", {"name": f"g{n}"}) for n in range(3)]
    assert shared.name == "main" and shared.__dict__ == {"name": "main"}


@pytest.mark.parametrize("local", KINDS)
def test_attributes_are_set_deleted_and_missing_as_on_any_object(local):
    shared = local()
    with pytest.raises(AttributeError):
        shared.missing
    shared.x = 1
    del shared.x
    with pytest.raises(AttributeError):
        del shared.x
    assert getattr(shared, "x", "default") == "default"
    with pytest.raises(AttributeError):
        shared.__dict__ = {}


@pytest.mark.parametrize("local", KINDS)
def test_arguments_need_an_init(local):
    with pytest.raises(TypeError):
        local(1)
    with pytest.raises(TypeError):
        local(key="value")


@pytest.mark.parametrize("local", KINDS)
def test_a_subclass_init_runs_again_in_each_greenlet_with_the_same_arguments(local):
    calls = []

    class Request(local):
        shared_default = "class attribute"
        __slots__ = ("slot",)

        def __init__(self, path, method="GET"):
            calls.append((path, method))
            self.path = path
            self.method = method

        @property
        def line(self):
            return f"{self.method} {self.path}"

        def describe(self):
            return self.line

    request = Request("/", method="HEAD")
    request.slot = "one for all"
    request.path = "/main"

    def read():
        return request.describe(), request.shared_default, request.slot

    assert in_greenlet(read) == ("HEAD /", "class attribute", "one for all")
    assert request.describe() == "HEAD /main"
    assert calls == [("/", "HEAD"), ("/", "HEAD")]


@needs_c
def test_an_init_that_raises_is_tried_again_at_the_next_touch():
    """As CPython's threading.local does for a thread (gevent's keeps the
    empty namespace instead)."""
    local = C_LOCAL
    failures = ["once"]

    class Flaky(local):
        def __init__(self):
            if failures:
                raise ValueError(failures.pop())
            self.ready = True

    failures.clear()
    flaky = Flaky()  # __init__ runs in the creating greenlet: it succeeds here
    failures.append("once")

    def touch():
        with pytest.raises(ValueError, match="once"):
            flaky.ready
        return flaky.ready

    assert in_greenlet(touch) is True


@pytest.mark.parametrize("local", KINDS)
def test_an_init_that_switches_greenlets_keeps_each_ones_attributes(local):
    class Slow(local):
        def __init__(self):
            self.before = gevent.getcurrent()
            gevent.sleep(0)  # another greenlet runs its own __init__ here
            self.after = gevent.getcurrent()

    slow = Slow()

    def check():
        return slow.before is slow.after is gevent.getcurrent()

    greenlets = [gevent.spawn(check) for _ in range(4)]
    gevent.joinall(greenlets)
    assert [g.get() for g in greenlets] == [True] * 4


@pytest.mark.parametrize("local", KINDS)
def test_a_greenlets_attributes_go_when_the_greenlet_is_freed(local):
    shared = local()
    watched = []

    def keep():
        value = Value()
        shared.value = value
        watched.append(weakref.ref(value))

    greenlet = gevent.spawn(keep)
    greenlet.join()
    gevent.sleep(0)  # its link callbacks run, and drop their reference
    del greenlet
    assert watched[0]() is None
    if local is C_LOCAL:
        assert greenlets(shared) == 1  # the main greenlet's


@pytest.mark.parametrize("local", KINDS)
def test_a_finished_greenlets_attributes_go_even_when_they_hold_the_greenlet(local):
    """A greenlet stores in a local what leads back to it (a request that
    keeps its greenlet, for a timeout or a kill): the greenlet is never
    freed while the local holds its attributes. They go when it finishes,
    as gevent's local and CPython's (at a thread's end) drop them. The
    collector would not: they are reachable from the local."""
    shared = local()
    gc_was = gc.isenabled()
    gc.disable()
    try:
        def keep():
            shared.me = gevent.getcurrent()

        watched = []
        for _ in range(3):
            greenlet = gevent.spawn(keep)
            watched.append(weakref.ref(greenlet))
            greenlet.join()
            del greenlet
        gevent.sleep(0)  # their link callbacks run
        assert [ref() for ref in watched] == [None] * 3
        if local is C_LOCAL:
            assert greenlets(shared) == 1  # the main greenlet's (it made the local)
    finally:
        if gc_was:
            gc.enable()


@pytest.mark.parametrize("local", KINDS)
def test_a_greenlet_that_lives_on_keeps_no_callback_of_a_local_that_is_gone(local):
    """A long-lived greenlet (a kept-alive connection) that touches locals
    made and dropped as it goes (one per object, as some libraries make
    them) holds none of their finish callbacks; nor, with the C local, of
    an entry dropped because its __init__ failed."""

    class Failing(local):
        def __init__(self):
            raise ValueError("no")

    failing = Failing.__new__(Failing)  # its __init__ runs in each greenlet that touches it

    def touch_and_drop():
        for _ in range(3):
            made = local()
            made.value = 1
            del made
        if local is C_LOCAL:
            with pytest.raises(ValueError):
                failing.value
        answer.set(gevent.getcurrent().has_links())

    answer = gevent.event.AsyncResult()  # not join(): that would link to it
    gevent.spawn(touch_and_drop)
    assert answer.get(timeout=10) is False


@pytest.mark.parametrize("local", KINDS)
def test_greenlets_freed_one_after_another_each_start_empty(local):
    """A new greenlet may be made where a freed one was: it must not find
    the freed one's attributes."""
    shared = local()

    def fresh(n):
        seen = getattr(shared, "n", None)
        shared.n = n
        return seen

    # Plain greenlets are freed as soon as they return: the next is often
    # made at the same address.
    addresses = set()
    seen = []
    for n in range(200):
        runner = greenlet.greenlet(fresh)
        addresses.add(id(runner))
        seen.append(runner.switch(n))
        del runner
    assert seen == [None] * 200
    assert len(addresses) < 200, "no address was reused: the check proves nothing"


@pytest.mark.parametrize("local", KINDS)
def test_a_freed_local_frees_every_greenlets_attributes_and_the_greenlets_live_on(local):
    shared = local()
    watched = []
    step = gevent.event.Event()

    def keep(holder):
        holder[0].value = Value()
        watched.append(weakref.ref(holder[0].value))
        step.wait()
        return "done"

    holder = [shared]
    greenlet = gevent.spawn(keep, holder)
    gevent.sleep(0)
    gc_was = gc.isenabled()
    gc.disable()  # workers run without the collector: no cycle may hold these
    try:
        del shared
        holder.clear()
        assert watched[0]() is None
    finally:
        if gc_was:
            gc.enable()
    step.set()
    assert greenlet.get() == "done"


@pytest.mark.parametrize("local", KINDS)
def test_each_thread_has_its_own_attributes(local):
    shared = local()
    shared.name = "main"

    seen = {}

    def in_thread(name):
        seen[name] = getattr(shared, "name", None)
        shared.name = name
        seen[name] = (seen[name], shared.name)

    threads = [threading.Thread(target=in_thread, args=(name,)) for name in "ab"]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert seen == {"a": (None, "a"), "b": (None, "b")}
    assert shared.name == "main"
    assert threading.active_count() == 1


@needs_c
def test_the_c_local_costs_less_than_gevents_per_read():
    """Not a timing: the instructions it saves are counted in
    docs/benchmarks.md. Here, only that it does not create a dict per read
    (the main greenlet's stays the one it had)."""
    shared = C_LOCAL()
    shared.x = 1
    first = shared.__dict__
    for _ in range(3):
        assert shared.x == 1
    assert shared.__dict__ is first and greenlets(shared) == 1


INSTALL = """
import json, logging, sys
logging.basicConfig(level=logging.DEBUG, format="%(message)s", stream=sys.stdout)
from gevent import monkey
{patch}
import threading, _thread, _threading_local
from forkserve.process import greenlet_local
replaced = greenlet_local.install({enabled})
print(json.dumps([replaced, [type(threading.local()).__module__,
                             _thread._local.__module__, _threading_local.local.__module__]]))
"""


def install_in_fresh_interpreter(patch=True, enabled=True, env=None):
    code = INSTALL.format(patch="monkey.patch_all()" if patch else "", enabled=enabled)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60, env={**os.environ, **(env or {})})
    assert result.returncode == 0, result.stderr
    *log, last = result.stdout.strip().splitlines()
    import json
    return json.loads(last), "\n".join(log)


@needs_c
def test_install_replaces_gevents_local_everywhere_gevent_put_it_and_says_so():
    (replaced, modules), log = install_in_fresh_interpreter()
    assert replaced == ["threading.local", "_thread._local", "_threading_local.local"]
    assert modules == ["forkserve.process._greenlet_local"] * 3
    assert "threading.local: forkserve's C local" in log


@pytest.mark.parametrize("patch, enabled, env, why", [
    (True, False, {}, "threading.local: gevent's (--no-c-local)"),
    (True, True, {"FORKSERVE_NO_C": "1"}, "threading.local: gevent's (FORKSERVE_NO_C is set)"),
    (False, True, {}, "threading.local: left as it is (gevent did not patch it)"),
])
def test_install_leaves_the_local_where_it_does_not_apply_and_says_why(patch, enabled, env,
                                                                          why):
    if C_LOCAL is None and not env:
        pytest.skip(f"no C local: {WHY_NOT}")
    (replaced, modules), log = install_in_fresh_interpreter(patch, enabled, env)
    assert replaced == []
    assert "forkserve" not in " ".join(modules)
    assert why in log


def test_the_switch_is_on_by_default():
    assert settings.parse(["app:app"], environ={}).c_local is True
    assert settings.parse(["--no-c-local", "app:app"], environ={}).c_local is False
    assert settings.parse(["app:app"], environ={"FORKSERVE_C_LOCAL": "0"}).c_local is False


def concurrent_gets(server, count):
    """`count` requests at once on their own connections (the app answers
    once all of them have arrived)."""
    with ThreadPoolExecutor(count) as pool:
        return list(pool.map(lambda n: server.get(f"/{count}/req{n}"), range(count)))


@pytest.mark.e2e
@pytest.mark.parametrize("args, kind", [
    pytest.param((), "forkserve.process._greenlet_local.local", marks=needs_c),
    ((), None),
    (("--no-c-local",), GEVENT_LOCAL),
])
def test_a_workers_concurrent_requests_each_keep_their_own_locals(run_server, args, kind):
    env = {} if kind is not None else {"FORKSERVE_NO_C": "1"}
    server = run_server("-w", "1", "--log-level", "debug", *args, app="greenlet_locals:app",
                        env=env)
    answers = concurrent_gets(server, 8)
    assert threading.active_count() == 1
    expected_kind = kind or GEVENT_LOCAL
    assert answers == [(200, f"{expected_kind} req{n} REQ{n}") for n in range(8)]
    log = server.log()
    if expected_kind.startswith("forkserve"):
        assert "threading.local: forkserve's C local" in log
    else:
        assert "threading.local: gevent's" in log


@pytest.mark.e2e
@pytest.mark.parametrize("args", [pytest.param((), id="c", marks=needs_c),
                                  pytest.param(("--no-c-local",), id="gevent")])
def test_a_worker_frees_each_closed_connections_greenlet(run_server, args):
    """Each request keeps its environ and its greenlet in a local; 40
    connections, one request each, must leave no greenlet that a
    collection cannot free."""
    server = run_server("-w", "1", *args, app="greenlet_locals:app")

    def alive():
        status, body = server.get("/greenlets")
        assert status == 200, body
        return int(body)

    before = alive()
    assert [server.get(f"/1/r{n}")[0] for n in range(40)] == [200] * 40
    poll(lambda: alive() <= before, message=f"40 closed connections' greenlets to be freed "
                                            f"(alive before: {before})")


@pytest.mark.parametrize("local", KINDS)
def test_what_bypasses_the_local_finds_no_greenlets_attributes(local):
    """object.__getattribute__ and inspect.getattr_static skip the local's
    own lookup: they must not find the attributes of whichever greenlet
    touched it last."""
    import inspect
    shared = local()
    shared.user = "main's"
    in_greenlet(lambda: setattr(shared, "user", "another greenlet's"))
    with pytest.raises(AttributeError):
        object.__getattribute__(shared, "user")
    assert inspect.getattr_static(shared, "user", None) is None
    assert shared.user == "main's"


@needs_c
def test_a_local_a_finaliser_brings_back_still_drops_dead_greenlets_attributes():
    """The collector clears weak references to a local in a cycle before
    running finalisers; one that keeps the local must not leave it handing
    a dead greenlet's attributes to a new greenlet at the same address."""
    kept = []

    class Request(C_LOCAL):
        def __del__(self):
            kept.append(self)

    request = Request()
    request.me = request  # a cycle, through the main greenlet's dict
    del request
    gc.collect()
    request = kept.pop()
    seen = []
    for n in range(200):
        def handle(n=n):
            previous = getattr(request, "user", None)
            request.user = n
            return previous
        runner = greenlet.greenlet(handle)
        seen.append(runner.switch())
        del runner, handle
    assert seen == [None] * 200
    assert greenlets(request) == 1  # the main greenlet's
    del request.me  # the cycle, for the collector's next run


@needs_c
def test_a_collection_while_a_greenlet_first_touches_the_local_runs_init_once():
    """On 3.11 an allocation may collect garbage, whose finaliser may touch
    the local in the same greenlet before its first touch has finished
    (gevent's local then runs __init__ twice, and loses the finaliser's
    write)."""
    local = C_LOCAL
    inits = []

    class Request(local):
        def __init__(self):
            inits.append(greenlet.getcurrent())

    shared = Request()

    class Garbage:
        def __init__(self):
            self.me = self

        def __del__(self):
            shared.from_finaliser = True

    def first_touch():
        Garbage()
        shared.a = 1
        return greenlet.getcurrent()

    threshold, enabled = gc.get_threshold(), gc.isenabled()
    gc.enable()
    try:
        gc.set_threshold(1)
        runners = [greenlet.greenlet(first_touch).switch() for _ in range(50)]
    finally:
        gc.set_threshold(*threshold)
        if not enabled:
            gc.disable()
    assert len(inits) == 51  # the creator's, then one per greenlet
    assert len(set(map(id, inits))) == 51
    del runners


@needs_c
@pytest.mark.parametrize("version, why", [
    ("4.0.0", "greenlet 4 is not one whose C API this was checked against"),
    ("dev", "greenlet.__version__ does not start with a number"),
])
def test_a_greenlet_nobody_checked_keeps_gevents_local_and_says_why(version, why):
    code = (f"import greenlet; greenlet.__version__ = {version!r}\n"
            "from forkserve.process import greenlet_local\n"
            "print(greenlet_local.c_local()[1])")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    assert why in result.stdout
