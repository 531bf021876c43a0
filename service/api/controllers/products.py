"""Public product route: sale info and remaining stock."""

from __future__ import annotations

from litestar import Controller, get
from litestar.di import NamedDependency

from service.api.openapi import problems
from service.api.params import ProductIdPath
from service.domain.stock.catalog import CatalogService, ProductView


class ProductController(Controller):
    path = "/products"
    tags = ["products"]

    @get("/{product_id:int}", summary="Sale info and remaining stock", opt=problems("product_not_found"))
    async def show(self, product_id: ProductIdPath, catalog: NamedDependency[CatalogService]) -> ProductView:
        """Sale info and remaining stock; 404 product_not_found."""
        return await catalog.get(product_id)
