from flask import Blueprint, current_app, render_template

blueprint = Blueprint("pages", __name__)


@blueprint.route("/")
def index():
    catalog = current_app.config["CATALOG"]
    return render_template("index.html", featured=catalog["products"][:12],
                           categories=sorted(catalog["by_category"]))


@blueprint.route("/about")
def about():
    return render_template("text.html", title="About", text="A shop made to test forkserve.")


@blueprint.route("/contact")
def contact():
    return render_template("text.html", title="Contact", text="shop@example.invalid")


@blueprint.route("/help")
def help_page():
    return render_template("text.html", title="Help", text="Search, browse, buy.")


@blueprint.app_errorhandler(404)
def not_found(error):
    return render_template("text.html", title="Not found", text=str(error)), 404
