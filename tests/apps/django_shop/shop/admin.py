from django.contrib import admin

from django_shop.shop.models import Category, Product


@admin.register(Category)
class CategoryAdmin(admin.ModelAdmin):
    list_display = ["name", "slug"]
    prepopulated_fields = {"slug": ["name"]}


@admin.register(Product)
class ProductAdmin(admin.ModelAdmin):
    list_display = ["name", "category", "price", "stock"]
    list_filter = ["category"]
    search_fields = ["name", "description"]
    list_select_related = ["category"]
