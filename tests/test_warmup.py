"""Warm-up in the master: forkserve.process.warmup.Client and the pre_freeze hook.

The Client is a WSGI caller that keeps the cookies answers set, so a
warm-up can log in (POST a form) and then reach pages behind the login; the
pre_freeze(server, app) hook in a config file is where a warm-up written in
Python runs: in the master, before the heap is shared and frozen.
"""

import re
import urllib.parse
from wsgiref.validate import validator

import pytest

from conftest import APPS
from forkserve.process import warmup
from test_share_heap_e2e import SHARED, needs_immortal


def _login_app(environ, start_response):
    """/login sets a session cookie for a POSTed name; /secret needs it."""
    cookies = dict(pair.strip().split("=", 1) for pair in
                   environ.get("HTTP_COOKIE", "").split(";") if "=" in pair)
    if environ["PATH_INFO"] == "/login" and environ["REQUEST_METHOD"] == "POST":
        length = int(environ.get("CONTENT_LENGTH") or 0)
        form = urllib.parse.parse_qs(environ["wsgi.input"].read(length).decode())
        assert environ["CONTENT_TYPE"] == "application/x-www-form-urlencoded"
        start_response("302 Found", [("Location", "/secret"), ("Content-Type", "text/plain"),
                                     ("Set-Cookie", f"session={form['name'][0]}; HttpOnly")])
        return [b""]
    if environ["PATH_INFO"] == "/secret" and "session" in cookies:
        body = f"hello {cookies['session']}".encode()
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [body]
    start_response("403 Forbidden", [("Content-Type", "text/plain")])
    return [b"log in first"]


def test_client_keeps_the_cookie_a_login_sets_and_sends_it_back():
    client = warmup.Client(validator(_login_app))
    assert client.get("/secret").code == 403
    login = client.post("/login", {"name": "warmup"})
    assert (login.code, login.header("location")) == (302, "/secret")
    assert client.cookies == {"session": "warmup"}
    answer = client.get("/secret")
    assert (answer.status, answer.body) == ("200 OK", b"hello warmup")


def test_client_refuses_a_url_and_says_to_give_a_path():
    with pytest.raises(ValueError, match="must start with '/'"):
        warmup.Client(_login_app).get("http://localhost/secret")


DJANGO_WARMED = re.compile(r"pre_freeze: logged in \(302 Found\), /admin/ 200 OK, "
                           r"\d+ pages \{200: \d+\} in [\d.]+ s \(pid (\d+)\)")


def _django_warmed(run_server, tmp_path, *flags):
    server = run_server("-c", str(APPS / "django_shop" / "warmup.conf.py"), *flags, "-w", "1",
                        app="django_shop.wsgi:application", timeout=90,
                        env={"DJANGO_SHOP_DB": str(tmp_path / "shop.sqlite3")})
    log = server.log()
    match = DJANGO_WARMED.search(log)
    assert match, log
    assert int(match.group(1)) == server.pid  # in the master
    assert log.index("pre_freeze: logged in") < log.index("Listening at")
    return server, log


def test_pre_freeze_hook_logs_in_and_fetches_admin_pages_in_the_master(run_server, tmp_path,
                                                                      monkeypatch):
    server, _ = _django_warmed(run_server, tmp_path)
    monkeypatch.syspath_prepend(str(APPS))
    from django_shop import client
    headers = client.login(server.port)  # the worker serves the admin as before
    assert server.get("/admin/shop/product/", headers=headers)[0] == 200


@needs_immortal
def test_pre_freeze_hook_runs_before_the_heap_is_shared(run_server, tmp_path):
    _, log = _django_warmed(run_server, tmp_path, "--share-heap")
    assert log.index("pre_freeze: logged in") < SHARED.search(log).start()


ORDER_APP = '''
import os

def app(environ, start_response):
    if environ["REQUEST_METHOD"] == "POST":  # each order placed is one line in the file
        with open(os.environ["ORDERS"], "a") as orders:
            orders.write(f"POST {environ['PATH_INFO']} pid {os.getpid()}\\n")
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"ok"]
'''

ORDER_CONF = '''
def pre_freeze(server, app):
    from forkserve.process.warmup import Client
    client = Client(app)
    client.post("/order", {"item": "1"})
    client.get("/")
'''


@needs_immortal
def test_a_warm_up_post_runs_exactly_once_with_share_heap(run_server, tmp_path):
    (tmp_path / "orders_app.py").write_text(ORDER_APP)
    (tmp_path / "orders.conf.py").write_text(ORDER_CONF)
    orders = tmp_path / "orders.txt"
    server = run_server("--share-heap", "-w", "1", "-c", str(tmp_path / "orders.conf.py"),
                        app="orders_app:app", cwd=tmp_path, env={"ORDERS": str(orders)})
    assert server.get("/") == (200, "ok")
    log = server.log()
    assert SHARED.search(log), log
    assert orders.read_text().splitlines() == [f"POST /order pid {server.pid}"], log
