"""Admin routes: products and stock, stock report, realignment."""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from litestar import Controller, Request, get, post, put
from litestar.di import NamedDependency
from litestar.params import FromQuery, JSONBody, QueryParameter

from service.api.auth import User, admin_only
from service.api.openapi import problems
from service.api.params import OrderNoPath, ProductIdPath
from service.domain.payments.service import PaymentService
from service.domain.stock.catalog import CatalogService, ProductInput
from service.domain.stock.realign import Realigner
from service.domain.stock.realign_report import RealignReport


class RefundBody(msgspec.Struct, forbid_unknown_fields=True):
    """``restock``: put the units back on sale once the channel confirms the refund (off by default)."""

    restock: bool = False


class RefundStarted(msgspec.Struct):
    """The refund asked of the channel that took the payment; ``status`` is ``refunding`` until
    the channel's ``refunded`` (units back on sale if ``restock``) or ``refund_failed`` /
    ``refund_rejected`` (back to ``paid``) notification."""

    order_no: str
    status: str
    refund_no: str
    channel: str
    restock: bool


class AdminController(Controller):
    path = "/admin"
    tags = ["admin"]
    guards = [admin_only]

    @put("/products/{product_id:int}", summary="Create or update a product, its sale window and stock")
    async def put_product(
        self, product_id: ProductIdPath, data: JSONBody[ProductInput], catalog: NamedDependency[CatalogService]
    ) -> RealignReport:
        """Create/update a product and load Redis by a realignment pass; returns that pass's report."""
        return await catalog.set(product_id, data)

    @get(
        "/products/{product_id:int}/stock",
        summary="MySQL and Redis stock, in flight, drift",
        opt=problems("product_not_found"),
    )
    async def stock(self, product_id: ProductIdPath, realigner: NamedDependency[Realigner]) -> RealignReport:
        """MySQL and Redis stock, in flight and drift: a dry-run realignment of the product."""
        return await realigner.realign(product_id, dry_run=True)

    @post(
        "/orders/{order_no:str}/refund",
        status_code=200,
        summary="Start the refund of a paid order",
        opt=problems(
            "invalid_order_no", "order_not_found", "order_not_refundable", "refund_refused", "channel_unavailable"
        ),
    )
    async def refund(
        self,
        request: Request[User, Any, Any],
        order_no: OrderNoPath,
        payments: NamedDependency[PaymentService],
        data: JSONBody[RefundBody | None] = None,
    ) -> RefundStarted:
        """``paid -> refunding`` and the refund asked of the paying channel; ``{"restock": true}``
        puts the units back on sale once the channel confirms it. 400 invalid_order_no, 404
        order_not_found, 409 order_not_refundable, 409 refund_refused (the channel said no, in its
        words; final, the order stays paid), 503 channel_unavailable (no answer; the order is paid
        again)."""
        restock = bool(data and data.restock)
        started = await payments.refund(order_no, restock, request.user.id)
        return RefundStarted(order_no, "refunding", started.refund_no, started.channel, restock)

    @post("/realign", status_code=200, summary="One realignment pass", opt=problems("product_not_found"))
    async def realign(
        self,
        realigner: NamedDependency[Realigner],
        product_id: Annotated[int | None, QueryParameter(ge=1, le=2**63 - 1)] = None,
        dry_run: FromQuery[bool] = False,
    ) -> list[RealignReport]:
        """One realignment pass over every product (or ``product_id``); ``dry_run`` writes nothing."""
        return await realigner.realign_pass(product_id, dry_run)
