"""Admin routes: products and stock, stock report, realignment."""

from __future__ import annotations

from litestar import Controller, get, post, put
from litestar.di import NamedDependency
from litestar.params import FromPath, FromQuery, JSONBody

from consumers.realign import RealignReport
from service.auth import admin_only
from service.catalog import ProductInput, set_product
from service.problems import Problem, field_error
from service.resources import Resources


class AdminController(Controller):
    path = "/admin"
    tags = ["admin"]
    guards = [admin_only]

    @put("/products/{product_id:int}", summary="Create or update a product, its sale window and stock")
    async def put_product(
        self, product_id: FromPath[int], data: JSONBody[ProductInput], resources: NamedDependency[Resources]
    ) -> RealignReport:
        if product_id < 1:
            raise field_error("product_id", "must be a positive integer")
        try:
            return await set_product(
                resources.engine,
                resources.redis,
                resources.realigner,
                resources.settings.redis.key_prefix,
                product_id,
                data,
            )
        except ValueError as exc:
            raise field_error("sale_ends_at", str(exc)) from None

    @get("/products/{product_id:int}/stock", summary="MySQL and Redis stock, in flight, drift")
    async def stock(self, product_id: FromPath[int], resources: NamedDependency[Resources]) -> RealignReport:
        try:
            return await resources.realigner.realign(product_id, dry_run=True)
        except LookupError:
            raise Problem(404, "product_not_found", f"Product {product_id} does not exist.") from None

    @post("/realign", status_code=200, summary="One realignment pass")
    async def realign(
        self,
        resources: NamedDependency[Resources],
        product_id: FromQuery[int | None] = None,
        dry_run: FromQuery[bool] = False,
    ) -> list[RealignReport]:
        if product_id is None:
            return await resources.realigner.realign_all(dry_run=dry_run)
        try:
            return [await resources.realigner.realign(product_id, dry_run=dry_run)]
        except LookupError:
            raise Problem(404, "product_not_found", f"Product {product_id} does not exist.") from None
