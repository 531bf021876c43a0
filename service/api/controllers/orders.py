"""Buyer routes: place an order (the purchase path) and read it back."""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from litestar import Controller, Request, Response, get, post
from litestar.datastructures import ResponseHeader
from litestar.di import NamedDependency
from litestar.params import (
    JSONBody,
    QueryParameter,
)
from msgspec import Meta

from service import metrics
from service.api import observe
from service.api.auth import User
from service.api.openapi import problems
from service.api.params import CursorQuery, IdempotencyKeyHeader, OrderNoPath
from service.api.problems import problem_response
from service.bootstrap import Resources
from service.domain.catalog import PositiveId
from service.domain.errors import DomainError
from service.domain.orders import OrderPage, OrderView
from service.domain.request_id import request_id_for

_ACCEPTED = metrics.purchase_outcome("accepted")


class PurchaseRequest(msgspec.Struct, forbid_unknown_fields=True):
    """``quantity`` in units, 1 to the product's per-user limit."""

    product_id: PositiveId
    quantity: Annotated[int, Meta(ge=1, le=2**31 - 1)]


class OrderAccepted(msgspec.Struct):
    """The 202 body: the order is queued for MySQL."""

    order_no: str
    request_id: str
    status: str
    product_id: int
    quantity: int


class OrderController(Controller):
    path = "/orders"
    tags = ["orders"]

    @post(
        "/",
        status_code=202,
        summary="Buy: reserve stock and queue the order",
        response_headers=[
            ResponseHeader(name="Location", description="/api/v1/orders/{order_no}", documentation_only=True)
        ],
        opt=problems(
            "invalid_idempotency_key",
            "product_not_found",
            "sold_out",
            "limit_exceeded",
            "sale_not_active",
            "request_in_progress",
            "idempotency_key_reused",
            "too_many_requests",
        ),
    )
    async def create_order(
        self,
        request: Request[User, Any, Any],
        data: JSONBody[PurchaseRequest],
        resources: NamedDependency[Resources],
        idempotency_key: IdempotencyKeyHeader = None,
    ) -> Response[OrderAccepted]:
        """Buy: ``{"product_id", "quantity"}`` (units) -> 202 ``OrderAccepted`` with ``Location``, only
        after the broker confirmed. ``Idempotency-Key`` (IETF Idempotency-Key draft, 1-64 visible
        ASCII) makes retries safe. Errors (RFC 9457 problem+json, ``code``): 400 invalid_request /
        invalid_idempotency_key, 401, 404 product_not_found, 409 sold_out / limit_exceeded /
        sale_not_active / request_in_progress, 422 idempotency_key_reused, 503 unavailable."""
        purchases = resources.purchase_service
        if idempotency_key is None and (answer := purchases.standing_rejection(data.product_id, data.quantity)):
            metrics.purchase_outcome(answer.code, "sold_out_flag").inc()
            return problem_response(answer)  # a stampede's usual answer: no Redis, no raise
        try:
            request_id = request_id_for(request.user.id, data.product_id, idempotency_key)
            client = request.client.host if request.client is not None else ""
            accepted = await purchases.purchase(
                request.user.id,
                data.product_id,
                data.quantity,
                request_id,
                keyed=idempotency_key is not None,
                client=client,
            )
        except DomainError as exc:
            metrics.purchase_outcome(exc.code).inc()
            raise
        _ACCEPTED.inc()
        observe.note_order(request.scope, accepted.request_id, accepted.order_no)
        body = OrderAccepted(accepted.order_no, accepted.request_id, "queued", accepted.product_id, accepted.quantity)
        return Response(body, status_code=202, headers={"Location": f"/api/v1/orders/{accepted.order_no}"})

    @get("/", summary="Your orders, newest first (keyset pages)")
    async def list_orders(
        self,
        request: Request[User, Any, Any],
        resources: NamedDependency[Resources],
        limit: Annotated[int, QueryParameter(ge=1, le=100)] = 20,
        cursor: CursorQuery = None,
    ) -> OrderPage:
        """The caller's orders in MySQL, newest first, ``limit`` per page; 400 for a foreign ``cursor``."""
        return await resources.orders.page(request.user.id, limit, cursor)

    @post(
        "/{order_no:str}/cancel",
        status_code=200,
        summary="Cancel your unpaid order; its units go back on sale",
        opt=problems("invalid_order_no", "order_not_found", "order_not_cancellable"),
    )
    async def cancel(
        self, request: Request[User, Any, Any], order_no: OrderNoPath, resources: NamedDependency[Resources]
    ) -> OrderView:
        """Cancel the caller's unpaid order; 400 invalid_order_no, 404 order_not_found, 409 order_not_cancellable."""
        return await resources.orders.cancel(request.user.id, order_no)

    @get("/{order_no:str}", summary="Read one of your orders", opt=problems("invalid_order_no", "order_not_found"))
    async def get_order(
        self, request: Request[User, Any, Any], order_no: OrderNoPath, resources: NamedDependency[Resources]
    ) -> OrderView:
        """The caller's order with its status history; 400 invalid_order_no, 404 order_not_found."""
        return await resources.orders.get(request.user.id, order_no)
