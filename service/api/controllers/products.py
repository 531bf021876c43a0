"""Public product route: sale info and remaining stock."""

from __future__ import annotations

from litestar import Controller, get
from litestar.di import NamedDependency

from service.api.problems import Problem
from service.bootstrap import Resources
from service.domain.catalog import ProductIdPath, ProductView, get_product


class ProductController(Controller):
    path = "/products"
    tags = ["products"]

    @get("/{product_id:int}", summary="Sale info and remaining stock")
    async def show(self, product_id: ProductIdPath, resources: NamedDependency[Resources]) -> ProductView:
        """Sale info and remaining stock; 404 product_not_found."""
        view = await get_product(resources.engine, resources.store, product_id)
        if view is None:
            raise Problem(404, "product_not_found", f"Product {product_id} does not exist.")
        return view
