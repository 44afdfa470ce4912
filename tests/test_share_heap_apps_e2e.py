"""A real Flask app and a real Django project answer the same with heap sharing.

tests/apps/flask_shop (blueprints, Jinja templates, JSON) and
tests/apps/django_shop (ORM on sqlite, the admin with a logged-in session,
templates, i18n) are each served twice, with --no-share-heap and with the
default (the heap shared), and every page of their client's list is compared.
"""

import re
import sys

import pytest

from conftest import APPS
from test_share_heap_e2e import SHARED, needs_immortal

sys.path.insert(0, str(APPS))  # the apps' client modules (they import no framework)

from django_shop import client as django_client  # noqa: E402
from flask_shop import client as flask_client  # noqa: E402

pytestmark = [pytest.mark.e2e, needs_immortal]

#: Django masks its CSRF token anew in every page that has a form.
CSRF = re.compile(r'(name="csrfmiddlewaretoken" value=)"[^"]+"')


def _answers(run_server, flags, app, env, pages, login=None):
    server = run_server(*flags, "-w", "2", app=app, env=env, timeout=60)
    try:
        headers = login(server.port) if login else {}
        answers = []
        for path in pages:
            status, body = server.get(path, headers=headers)
            answers.append((path, status, CSRF.sub(r"\1", body)))
        return answers, server.log()
    finally:
        server.kill_group()


def _compare(run_server, app, env_for, pages, login=None, flags=()):
    plain, _ = _answers(run_server, ["--no-share-heap", *flags], app, env_for("plain"), pages,
                        login)
    shared, log = _answers(run_server, list(flags), app, env_for("shared"), pages, login)
    assert SHARED.search(log), log
    assert [(p, s) for p, s, _ in plain if s != 200] == []
    for before, after in zip(plain, shared):
        assert before == after


def test_flask_app_answers_the_same_with_share_heap(run_server):
    _compare(run_server, "flask_shop:app", lambda name: {}, flask_client.PAGES)


def test_django_project_answers_the_same_with_share_heap(run_server, tmp_path):
    _compare(run_server, "django_shop.wsgi:application",
             lambda name: {"DJANGO_SHOP_DB": str(tmp_path / f"{name}.sqlite3")},
             django_client.PAGES, django_client.login)


def test_django_project_answers_the_same_after_its_logged_in_warm_up(run_server, tmp_path):
    """With the warm-up that logs in to the admin (a pre_freeze hook) before the
    heap is shared."""
    _compare(run_server, "django_shop.wsgi:application",
             lambda name: {"DJANGO_SHOP_DB": str(tmp_path / f"{name}.sqlite3")},
             django_client.PAGES, django_client.login,
             flags=["-c", str(APPS / "django_shop" / "warmup.conf.py")])
