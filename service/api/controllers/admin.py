"""Admin routes: products and stock, stock report, realignment."""

from __future__ import annotations

from typing import Annotated

import msgspec
from litestar import Controller, get, post, put
from litestar.di import NamedDependency
from litestar.params import FromPath, FromQuery, JSONBody, QueryParameter

from service.api.auth import admin_only
from service.api.problems import Problem, field_error, require_order_no
from service.bootstrap import Resources
from service.domain.catalog import (
    InvalidProduct,
    ProductIdPath,
    ProductInput,
    set_product,
)
from service.domain.lifecycle import OrderNotFound, TransitionLost, give_back_to_redis
from service.domain.payments import request_refund
from service.domain.realign import RealignReport


class RefundRequest(msgspec.Struct, forbid_unknown_fields=True):
    """``restock``: put the units back on sale (off by default for refunds of paid orders)."""

    restock: bool = False


class OrderStatusAnswer(msgspec.Struct):
    order_no: str
    status: str
    restocked: bool = False


class AdminController(Controller):
    path = "/admin"
    tags = ["admin"]
    guards = [admin_only]

    @put("/products/{product_id:int}", summary="Create or update a product, its sale window and stock")
    async def put_product(
        self, product_id: ProductIdPath, data: JSONBody[ProductInput], resources: NamedDependency[Resources]
    ) -> RealignReport:
        """Create/update a product and load Redis by a realignment pass; returns that pass's report."""
        try:
            return await set_product(resources.engine, resources.realigner, product_id, data)
        except InvalidProduct as exc:
            raise field_error(exc.field, str(exc)) from None

    @get("/products/{product_id:int}/stock", summary="MySQL and Redis stock, in flight, drift")
    async def stock(self, product_id: ProductIdPath, resources: NamedDependency[Resources]) -> RealignReport:
        """MySQL and Redis stock, in flight and drift: a dry-run realignment of the product."""
        try:
            return await resources.realigner.realign(product_id, dry_run=True)
        except LookupError:
            raise Problem(404, "product_not_found", f"Product {product_id} does not exist.") from None

    @post("/orders/{order_no:str}/refund", status_code=200, summary="Start the refund of a paid order")
    async def refund(
        self, order_no: FromPath[str], resources: NamedDependency[Resources], data: JSONBody[RefundRequest | None] = None
    ) -> OrderStatusAnswer:
        """``paid -> refunding``; ``{"restock": true}`` also puts the units back on sale."""
        require_order_no(order_no)
        restock = bool(data and data.restock)
        try:
            returned = await request_refund(resources.engine, order_no, restock)
        except OrderNotFound:
            raise Problem(404, "order_not_found", f"No order {order_no}.") from None
        except TransitionLost as lost:
            raise Problem(409, "order_not_refundable", f"The order is {lost.current.label}.") from None
        if returned is not None:
            await give_back_to_redis(resources.store, returned)
        return OrderStatusAnswer(order_no, "refunding", restocked=restock)

    @post("/realign", status_code=200, summary="One realignment pass")
    async def realign(
        self,
        resources: NamedDependency[Resources],
        product_id: Annotated[int | None, QueryParameter(ge=1, le=2**63 - 1)] = None,
        dry_run: FromQuery[bool] = False,
    ) -> list[RealignReport]:
        """One realignment pass over every product (or ``product_id``); ``dry_run`` writes nothing."""
        if product_id is None:
            return await resources.realigner.realign_all(dry_run=dry_run)
        try:
            return [await resources.realigner.realign(product_id, dry_run=dry_run)]
        except LookupError:
            raise Problem(404, "product_not_found", f"Product {product_id} does not exist.") from None
