"""A one-module Django project (settings, URLs and views), served as
django_site:application like a project's wsgi.py. SECURE_SSL_REDIRECT is on:
behind a proxy that says X-Forwarded-Proto: https, the site must not
redirect (the loop issue #13 describes)."""

from django.conf import settings

settings.configure(
    DEBUG=False,
    SECRET_KEY="test-only-not-secret",
    ALLOWED_HOSTS=["*"],
    ROOT_URLCONF=__name__,
    MIDDLEWARE=["django.middleware.security.SecurityMiddleware"],
    SECURE_SSL_REDIRECT=True,
    SECURE_PROXY_SSL_HEADER=None,
    USE_TZ=True,
)

from django.core.wsgi import get_wsgi_application  # noqa: E402
from django.http import HttpResponse  # noqa: E402
from django.urls import path  # noqa: E402


def hello(request):
    return HttpResponse(f"hello from django over {request.scheme}\n",
                        content_type="text/plain")


urlpatterns = [path("hello", hello)]

application = get_wsgi_application()
