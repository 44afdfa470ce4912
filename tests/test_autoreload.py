"""--reload: a changed source file reloads the application (development tool)."""

import os

import pytest

from forkserve.process.source_watch import SourceWatcher, source_files

from forkserve_testing import poll


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_watcher_reports_a_changed_file_once_and_only_after_its_interval():
    times = {"/a.py": 1, "/b.py": 1}
    clock = Clock()
    watcher = SourceWatcher(times, interval=1.0, clock=clock, mtime=times.get)
    times["/b.py"] = 2
    assert watcher.changed() is None  # not yet time to look
    clock.now = 1.0
    assert watcher.changed() == "/b.py"
    clock.now = 2.0
    assert watcher.changed() is None  # re-armed: the same change is not reported again
    times["/a.py"] = None  # deleted
    clock.now = 3.0
    assert watcher.changed() == "/a.py"


def test_source_files_are_the_modules_files_and_the_extra_ones(tmp_path):
    class Module:
        __file__ = str(tmp_path / "m.pyc")
    files = source_files({"m": Module(), "builtin": object()}, extra=[str(tmp_path / "t.html")])
    assert files == {str(tmp_path / "m.py"), str(tmp_path / "t.html")}


APP = '''
def app(environ, start_response):
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"VERSION"]
'''


def write_app(path, version):
    path.write_text(APP.replace("VERSION", version))
    stamp = os.stat(path).st_mtime_ns + (10**9 if version != "one" else 0)
    os.utime(path, ns=(stamp, stamp))  # a visible change even within one mtime tick


@pytest.mark.e2e
@pytest.mark.parametrize("workers", ["1", "0"])
def test_editing_the_application_reloads_it(run_server, tmp_path, workers):
    source = tmp_path / "editable_app.py"
    write_app(source, "one")
    server = run_server("-w", workers, "--reload", app="editable_app:app", cwd=str(tmp_path))
    assert server.get("/")[1] == "one"
    assert "--reload is a development tool" in server.log()
    write_app(source, "two")
    poll(lambda: server.get("/")[1] == "two", timeout=30, message="the edited app to serve")
    assert "editable_app.py changed: reloading (--reload)" in server.log()
    write_app(source, "three")  # again, now from the generation under the supervisor
    poll(lambda: server.get("/")[1] == "three", timeout=30, message="a second reload")
