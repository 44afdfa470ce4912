from django.apps import AppConfig


class ShopConfig(AppConfig):
    name = "django_shop.shop"
    label = "shop"
