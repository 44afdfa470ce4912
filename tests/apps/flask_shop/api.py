import statistics

from flask import Blueprint, abort, current_app, jsonify, request

blueprint = Blueprint("api", __name__)


def _catalog():
    return current_app.config["CATALOG"]


@blueprint.route("/health")
def health():
    return jsonify(status="ok")


@blueprint.route("/categories")
def categories():
    return jsonify({name: len(items) for name, items in _catalog()["by_category"].items()})


@blueprint.route("/stats")
def stats():
    prices = [p["price"] for p in _catalog()["products"]]
    return jsonify(count=len(prices), mean=round(statistics.fmean(prices), 2),
                   median=statistics.median(prices), stock=sum(p["stock"] for p in
                                                               _catalog()["products"]))


@blueprint.route("/products")
def products():
    limit = min(int(request.args.get("limit", 20)), 100)
    return jsonify(products=_catalog()["products"][:limit])


@blueprint.route("/products/<int:number>")
def product(number):
    items = _catalog()["products"]
    if not 0 <= number < len(items):
        abort(404)
    return jsonify(items[number])


@blueprint.route("/search")
def search():
    query = request.args.get("q", "").lower()
    return jsonify(ids=[p["id"] for p in _catalog()["products"] if query in p["name"].lower()])
