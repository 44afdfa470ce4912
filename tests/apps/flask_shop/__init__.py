"""A Flask shop for --share-heap's checks: blueprints, Jinja templates, JSON.

Served as `flask_shop:app` from tests/apps. The catalogue (CATALOG_SIZE
products, 2,000 by default) is built at import, in the master, as a real
app would load its reference data. flask_shop.client lists the pages a
client visits, for the tests and benchmarks/share_heap.py.
"""

from flask import Flask

from flask_shop import api, catalog, pages
from flask_shop.data import SIZE, build_catalog


def create_app(size=SIZE):
    app = Flask(__name__)
    app.config["CATALOG"] = build_catalog(size)
    app.register_blueprint(pages.blueprint)
    app.register_blueprint(catalog.blueprint, url_prefix="/catalog")
    app.register_blueprint(api.blueprint, url_prefix="/api")
    return app


app = create_app()

