"""How a client uses the shop: log in to the admin, then the pages it visits."""

import http.client
import os
import re

PRODUCTS = int(os.environ.get("DJANGO_SHOP_PRODUCTS", "300"))

PAGES = (["/en/", "/fr/", "/de/", "/en/products/", "/fr/products/", "/en/products/?page=2",
          "/api/products.json", "/admin/", "/admin/shop/product/", "/admin/shop/category/",
          "/admin/shop/product/?q=Product+1", "/admin/auth/user/"]
         + [f"/en/categories/{name}/" for name in ("tools", "garden", "kitchen", "toys")]
         + [f"/{lang}/products/{pk}/" for lang in ("en", "fr")
            for pk in range(1, PRODUCTS + 1, max(1, PRODUCTS // 20))]
         + [f"/admin/shop/product/{pk}/change/" for pk in range(1, PRODUCTS + 1,
                                                                 max(1, PRODUCTS // 20))])

_TOKEN = re.compile(r'name="csrfmiddlewaretoken" value="([^"]+)"')


def login(port, username="admin", password="admin-password"):
    """Log in to the admin as a browser does: the headers of the logged-in session."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request("GET", "/admin/login/")
        response = connection.getresponse()
        page = response.read().decode()
        cookies = _cookies(response)
        token = _TOKEN.search(page).group(1)
        body = (f"csrfmiddlewaretoken={token}&username={username}&password={password}"
                "&next=/admin/")
        connection.request("POST", "/admin/login/", body=body, headers={
            "Content-Type": "application/x-www-form-urlencoded",
            "Cookie": "; ".join(f"{k}={v}" for k, v in cookies.items())})
        response = connection.getresponse()
        response.read()
        cookies.update(_cookies(response))
    finally:
        connection.close()
    if response.status != 302 or "sessionid" not in cookies:
        raise AssertionError(f"admin login failed: {response.status}, cookies {sorted(cookies)}")
    return {"Cookie": "; ".join(f"{k}={v}" for k, v in cookies.items())}


def _cookies(response):
    found = {}
    for header in response.headers.get_all("Set-Cookie") or []:
        name, _, rest = header.partition("=")
        found[name.strip()] = rest.split(";", 1)[0]
    return found
