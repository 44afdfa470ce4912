"""forkserve config for the shop: warm it up in the master, logged in to the admin.

    forkserve -c django_shop/warmup.conf.py --share-heap -w 4 django_shop.wsgi:application

pre_freeze runs in the master after the application is loaded and before
the heap is shared and frozen. It logs in as a browser does (the login page
sets the CSRF cookie; the form is posted with it) and then requests every
page of the client's list, the admin's included, three times, so the
admin's code, templates and caches are built once, in the master. The
login writes a session row and the user's last_login into the database,
once, in the master.
"""


import os
import time


def pre_freeze(server, app):
    from forkserve.process.warmup import Client
    from django_shop.client import PAGES

    started = time.perf_counter()
    client = Client(app)
    client.get("/admin/login/")
    login = client.post("/admin/login/", {
        "username": "admin", "password": "admin-password", "next": "/admin/",
        "csrfmiddlewaretoken": client.cookies["csrftoken"]})
    if login.code != 302 or "sessionid" not in client.cookies:
        raise RuntimeError(f"the warm-up's admin login answered {login.status}, cookies "
                           f"{sorted(client.cookies)}: check the admin user and password")
    statuses = {}
    for _ in range(3):
        for page in PAGES:
            code = client.get(page).code
            statuses[code] = statuses.get(code, 0) + 1
    admin = client.get("/admin/")
    server.log.info("pre_freeze: logged in (%s), /admin/ %s, %d pages %s in %.2f s (pid %d)",
                    login.status, admin.status, len(PAGES), dict(sorted(statuses.items())),
                    time.perf_counter() - started, os.getpid())
