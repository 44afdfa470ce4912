"""The shop's reference data: products with categories, prices and text."""

import os
import random

SIZE = int(os.environ.get("CATALOG_SIZE", "2000"))

CATEGORIES = ("tools", "garden", "kitchen", "toys", "books", "sports", "office", "music")
COLOURS = ("red", "blue", "green", "steel", "black", "white", "oak", "copper")


def build_catalog(size, seed=7):
    rng = random.Random(seed)
    products = []
    for number in range(size):
        colour, category = rng.choice(COLOURS), rng.choice(CATEGORIES)
        products.append({
            "id": number,
            "name": f"{colour.title()} {category[:-1].title()} No. {number}",
            "category": category,
            "colour": colour,
            "price": round(rng.uniform(1, 500), 2),
            "stock": rng.randrange(0, 200),
            "tags": sorted(rng.sample(COLOURS + CATEGORIES, 3)),
            "description": f"A {colour} thing for {category}, model {number}, "
                           f"rated {rng.randrange(1, 6)} stars by {rng.randrange(500)} people.",
        })
    return {"products": products,
            "by_category": {c: [p for p in products if p["category"] == c] for c in CATEGORIES}}
