from django.http import JsonResponse
from django.shortcuts import get_object_or_404, render
from django.views.generic import DetailView, ListView

from django_shop.shop.models import Category, Product


def index(request):
    return render(request, "shop/index.html", {
        "categories": Category.objects.all(),
        "featured": Product.objects.select_related("category")[:8],
    })


class ProductList(ListView):
    queryset = Product.objects.select_related("category")
    paginate_by = 25
    template_name = "shop/product_list.html"


class ProductDetail(DetailView):
    queryset = Product.objects.select_related("category")
    template_name = "shop/product_detail.html"


def category(request, slug):
    found = get_object_or_404(Category, slug=slug)
    return render(request, "shop/product_list.html", {
        "category": found, "object_list": found.products.all()[:25]})


def products_json(request):
    rows = Product.objects.values("id", "name", "price", "stock", "category__slug")[:50]
    return JsonResponse({"products": [dict(row, price=str(row["price"])) for row in rows]})
