from flask import Blueprint, abort, current_app, render_template, request

blueprint = Blueprint("catalog", __name__)
PAGE = 24


def _products():
    return current_app.config["CATALOG"]["products"]


@blueprint.route("/")
def listing():
    return render_template("listing.html", title="All products", products=_products()[:PAGE],
                           page=1)


@blueprint.route("/page/<int:page>")
def paged(page):
    start = (page - 1) * PAGE
    products = _products()[start:start + PAGE]
    if not products:
        abort(404)
    return render_template("listing.html", title=f"Page {page}", products=products, page=page)


@blueprint.route("/category/<name>")
def category(name):
    products = current_app.config["CATALOG"]["by_category"].get(name)
    if products is None:
        abort(404)
    return render_template("listing.html", title=name.title(), products=products[:PAGE], page=1)


@blueprint.route("/product/<int:number>")
def product(number):
    products = _products()
    if not 0 <= number < len(products):
        abort(404)
    item = products[number]
    related = [p for p in current_app.config["CATALOG"]["by_category"][item["category"]]
               if p["colour"] == item["colour"]][:6]
    return render_template("product.html", product=item, related=related)


@blueprint.route("/search")
def search():
    query = request.args.get("q", "").lower()
    found = [p for p in _products() if query in p["name"].lower()]
    if request.args.get("sort") == "price":
        found.sort(key=lambda p: p["price"])
    return render_template("listing.html", title=f"Search: {query}", products=found[:PAGE],
                           page=1)
