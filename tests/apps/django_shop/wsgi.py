import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "django_shop.settings")
application = get_wsgi_application()

from django_shop.setup import prepare  # noqa: E402  (needs the configured apps)

prepare()
