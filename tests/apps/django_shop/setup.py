"""Create the schema, the data and the superuser once, in the master, at load."""

from django.core.management import call_command
from django.db import connection, connections

from django_shop.client import PRODUCTS
CATEGORIES = ("tools", "garden", "kitchen", "toys", "books", "sports", "office", "music")


def prepare():
    if "shop_product" not in connection.introspection.table_names():
        call_command("migrate", run_syncdb=True, verbosity=0)
        _fill()
    connections.close_all()  # workers open their own connections after fork


def _fill():
    from django.contrib.auth.models import User

    from django_shop.shop.models import Category, Product
    categories = [Category.objects.create(name=name.title(), slug=name) for name in CATEGORIES]
    Product.objects.bulk_create(
        Product(name=f"Product {n}", category=categories[n % len(categories)],
                price=f"{(n * 37) % 500 + 0.99:.2f}", stock=(n * 13) % 50,
                description=f"Product number {n}, in {categories[n % len(categories)].name}.")
        for n in range(PRODUCTS))
    User.objects.create_superuser("admin", "admin@example.invalid", "admin-password")
