"""A Django project for --share-heap's checks: ORM on sqlite, admin, templates, i18n.

Served as `django_shop.wsgi:application` from tests/apps. Loading it (in
the master) creates the sqlite database at $DJANGO_SHOP_DB if it has no
tables: the schema, 8 categories, PRODUCTS products (300 by default) and the
superuser admin / admin-password. django_shop.client logs in to the admin
and lists the pages a client visits.
"""
