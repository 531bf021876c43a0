"""Buyer routes: place an order (the purchase path) and read it back."""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from litestar import Controller, Request, Response, get, post
from litestar.datastructures import ResponseHeader
from litestar.di import NamedDependency
from litestar.openapi import ResponseSpec
from litestar.params import (
    JSONBody,
    QueryParameter,
)
from msgspec import Meta

from service import metrics
from service.api import request_telemetry
from service.api.auth import User
from service.api.body import decode_body
from service.api.media import JSON_BODY_OPT
from service.api.openapi import REQUEST_SCHEMA_OPT, problems
from service.api.params import (
    AdmissionTokenHeader,
    CursorQuery,
    IdempotencyKeyHeader,
    OrderNoPath,
    OrderTokenHeader,
)
from service.api.problems import problem_response
from service.domain.errors import DomainError
from service.domain.orders.service import OrderPage, OrderService, OrderView
from service.domain.purchase.answers import Accepted
from service.domain.purchase.request_id import identify, mint_request_id
from service.domain.purchase.service import PurchaseService
from service.domain.stock.catalog import PositiveId

_ACCEPTED = metrics.purchase_outcome("accepted")
ADMISSION_REQUIRED = "admission_required"


def _queue_url(product_id: int) -> str:
    """Where a buyer without an admission queues for ``product_id`` (the waiting room's join route)."""
    return f"/api/v1/products/{product_id}/queue"


def _refused(exc: DomainError, product_id: int) -> Response[Any]:
    """The problem answer of a refused purchase: ``admission_required`` names the waiting room to
    join (``queue``); any other error goes to the app's handler (service/api/problems.py)."""
    if exc.code == ADMISSION_REQUIRED:
        return problem_response(exc, queue=_queue_url(product_id))
    raise exc


def _answer(request: Request[User, Any, Any], accepted: Accepted) -> Response[OrderAccepted]:
    """202 with the queued order (stock mode ``redis``) or 201 with the written one (``database``)."""
    _ACCEPTED.inc()
    request_telemetry.note_order(request.scope, accepted.request_id, accepted.order_no)
    status = accepted.status or "queued"
    body = OrderAccepted(accepted.order_no, accepted.request_id, status, accepted.product_id, accepted.quantity)
    return Response(
        body,
        status_code=202 if accepted.status is None else 201,
        headers={"Location": f"/api/v1/orders/{accepted.order_no}"},
    )


class PurchaseRequest(msgspec.Struct, forbid_unknown_fields=True):
    """``quantity`` in units, 1 to the product's per-user limit."""

    product_id: PositiveId
    quantity: Annotated[int, Meta(ge=1, le=2**31 - 1)]


class OrderAccepted(msgspec.Struct):
    """The 202 body (stock mode ``redis``: the order is queued for MySQL, ``status`` ``queued``)
    or the 201 body (stock mode ``database``: MySQL holds the order, ``status`` its status,
    ``pending_payment`` when new)."""

    order_no: str
    request_id: str
    status: str
    product_id: int
    quantity: int


class TokenRequest(msgspec.Struct, forbid_unknown_fields=True):
    """The product the order page is opened for."""

    product_id: PositiveId


class OrderToken(msgspec.Struct):
    """A server-issued order token (send it as header ``Order-Token`` on the purchase) and its
    lifetime in seconds."""

    token: str
    expires_in: int


class OrderController(Controller):
    path = "/orders"
    tags = ["orders"]

    @post(
        "/",
        status_code=202,
        summary="Buy: reserve stock and queue the order (redis mode) or write it (database mode)",
        responses={
            201: ResponseSpec(OrderAccepted, description="Stock mode database: the order is written, pending_payment")
        },
        response_headers=[
            ResponseHeader(name="Location", description="/api/v1/orders/{order_no}", documentation_only=True)
        ],
        opt={
            # the body is decoded in the handler, in one strict pass (service/api/body.py)
            JSON_BODY_OPT: True,
            REQUEST_SCHEMA_OPT: PurchaseRequest,
            **problems(
                "invalid_idempotency_key",
                "product_not_found",
                "sold_out",
                "limit_exceeded",
                "sale_not_active",
                "request_in_progress",
                "idempotency_key_reused",
                "too_many_requests",
                "token_invalid",
                "token_required",
                "admission_required",
            ),
        },
    )
    async def create_order(
        self,
        request: Request[User, Any, Any],
        purchases: NamedDependency[PurchaseService],
        idempotency_key: IdempotencyKeyHeader = None,
        order_token: OrderTokenHeader = None,
        admission_token: AdmissionTokenHeader = None,
    ) -> Response[OrderAccepted]:
        """Buy: ``{"product_id", "quantity"}`` (units). Stock mode ``redis``: 202 ``OrderAccepted``
        (``queued``) with ``Location``, only after the broker confirmed; ``database``: 201 with the
        order already ``pending_payment``. ``Idempotency-Key`` (IETF Idempotency-Key draft, 1-64
        visible ASCII) makes retries safe; ``Order-Token`` (from ``POST /orders/tokens``, required
        when the product has ``require_token``) is consumed by the purchase and is its idempotency
        key (it wins over ``Idempotency-Key``). ``Admission-Token`` (from the product's waiting
        room, required when the product has ``waiting_room``) is consumed by the purchase; without
        an ``Idempotency-Key`` it is the idempotency key. Errors (RFC 9457 problem+json, ``code``):
        400 invalid_request / invalid_idempotency_key, 401, 404 product_not_found, 409 sold_out /
        limit_exceeded / sale_not_active / request_in_progress / token_invalid, 422
        idempotency_key_reused, 428 token_required / admission_required (with ``queue``, the
        waiting room to join), 429 too_many_requests, 503 unavailable."""
        data = await decode_body(request, PurchaseRequest)
        user_id, product_id = request.user.id, data.product_id
        try:
            request_id = identify(user_id, product_id, idempotency_key, order_token, admission_token)
        except DomainError as exc:
            return _refused(exc, product_id)
        if request_id is None and (answer := purchases.standing_rejection(product_id, data.quantity)):
            metrics.purchase_outcome(answer.code, "sold_out_flag").inc()
            return problem_response(answer)  # a stampede's usual answer: no Redis, no raise
        try:
            accepted = await purchases.purchase(
                user_id,
                product_id,
                data.quantity,
                request_id or mint_request_id(),
                order_token=order_token,
                client=request.client.host if request.client is not None else "",
                admission=admission_token,
            )
        except DomainError as exc:
            metrics.purchase_outcome(exc.code).inc()
            return _refused(exc, product_id)
        return _answer(request, accepted)

    @post(
        "/tokens",
        status_code=201,
        summary="An order token for a product (anti-duplicate submit)",
        opt=problems("product_not_found"),
    )
    async def create_token(
        self,
        request: Request[User, Any, Any],
        data: JSONBody[TokenRequest],
        purchases: NamedDependency[PurchaseService],
    ) -> OrderToken:
        """``{"product_id"}`` -> 201 ``{"token", "expires_in"}`` (seconds; issued when the
        order page opens, ``SET token EX 300``, deleted atomically by the purchase that sends it
        as ``Order-Token``; docs/ARCHITECTURE.md). Errors: 400 invalid_request, 401, 404
        product_not_found, 503 unavailable."""
        token = await purchases.issue_token(request.user.id, data.product_id)
        return OrderToken(token, purchases.token_ttl_seconds)

    @get("/", summary="Your orders, newest first (keyset pages)")
    async def list_orders(
        self,
        request: Request[User, Any, Any],
        orders: NamedDependency[OrderService],
        limit: Annotated[int, QueryParameter(ge=1, le=100)] = 20,
        cursor: CursorQuery = None,
    ) -> OrderPage:
        """The caller's orders in MySQL, newest first, ``limit`` per page; 400 for a foreign ``cursor``."""
        return await orders.page(request.user.id, limit, cursor)

    @post(
        "/{order_no:str}/cancel",
        status_code=200,
        summary="Cancel your unpaid order; its units go back on sale",
        opt=problems("invalid_order_no", "order_not_found", "order_not_cancellable"),
    )
    async def cancel(
        self, request: Request[User, Any, Any], order_no: OrderNoPath, orders: NamedDependency[OrderService]
    ) -> OrderView:
        """Cancel the caller's unpaid order; 400 invalid_order_no, 404 order_not_found, 409 order_not_cancellable."""
        return await orders.cancel(request.user.id, order_no)

    @get("/{order_no:str}", summary="Read one of your orders", opt=problems("invalid_order_no", "order_not_found"))
    async def get_order(
        self, request: Request[User, Any, Any], order_no: OrderNoPath, orders: NamedDependency[OrderService]
    ) -> OrderView:
        """The caller's order with its status history; 400 invalid_order_no, 404 order_not_found."""
        return await orders.get(request.user.id, order_no)
