"""The pages a client of the shop visits (light: imports no Flask)."""

from flask_shop.data import SIZE

PAGES = (["/", "/about", "/contact", "/help", "/catalog/", "/catalog/search?q=blue",
          "/catalog/search?q=steel&sort=price", "/api/health", "/api/categories",
          "/api/stats", "/api/products?limit=20", "/api/search?q=red"]
         + [f"/catalog/category/{name}" for name in ("tools", "garden", "kitchen", "toys")]
         + [f"/catalog/product/{n}" for n in range(0, SIZE, max(1, SIZE // 40))]
         + [f"/api/products/{n}" for n in range(0, SIZE, max(1, SIZE // 40))]
         + [f"/catalog/page/{n}" for n in range(1, 11)])
