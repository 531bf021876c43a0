"""Public product route: sale info and remaining stock."""

from __future__ import annotations

import msgspec
from litestar import Controller, get
from litestar.di import NamedDependency

from service.api.openapi import problems
from service.api.params import ProductIdPath
from service.domain.stock.catalog import CatalogService, ProductView
from service.settings import Settings


class PricedProduct(ProductView):
    """:class:`ProductView` with ``currency``: the shop's (ISO 4217), the one ``price`` is in
    minor units of."""

    currency: str


class ProductController(Controller):
    path = "/products"
    tags = ["products"]

    @get("/{product_id:int}", summary="Sale info and remaining stock", opt=problems("product_not_found"))
    async def show(
        self, product_id: ProductIdPath, catalog: NamedDependency[CatalogService], settings: NamedDependency[Settings]
    ) -> PricedProduct:
        """Sale info and remaining stock, ``price`` in minor units of ``currency``; 404 product_not_found."""
        view = await catalog.get(product_id)
        return PricedProduct(**msgspec.structs.asdict(view), currency=settings.payment.currency)
