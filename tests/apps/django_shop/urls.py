from django.conf.urls.i18n import i18n_patterns
from django.contrib import admin
from django.urls import path

from django_shop.shop import views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/products.json", views.products_json, name="products-json"),
] + i18n_patterns(
    path("", views.index, name="index"),
    path("products/", views.ProductList.as_view(), name="products"),
    path("products/<int:pk>/", views.ProductDetail.as_view(), name="product"),
    path("categories/<slug:slug>/", views.category, name="category"),
)
