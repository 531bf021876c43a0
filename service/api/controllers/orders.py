"""Buyer routes: place an order (the purchase path) and read it back."""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from litestar import Controller, Request, Response, get, post
from litestar.di import NamedDependency
from litestar.params import (
    FromPath,
    FromQuery,
    HeaderParameter,
    JSONBody,
    QueryParameter,
)
from msgspec import Meta

from service.api.auth import User
from service.api.problems import Problem, field_error, require_order_no
from service.bootstrap import Resources
from service.domain.catalog import PositiveId, product_exists
from service.domain.lifecycle import (
    OrderNotFound,
    TransitionLost,
    cancel_order,
    give_back_to_redis,
)
from service.domain.orders import (
    BadCursor,
    OrderPage,
    OrderView,
    find_order,
    list_orders,
)
from service.domain.purchase import PurchaseRejected
from service.domain.request_id import (
    is_valid_idempotency_key,
    mint_request_id,
    request_id_from_key,
)


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


_STATUS = {
    "sold_out": 409,
    "limit_exceeded": 409,
    "sale_not_active": 409,
    "request_in_progress": 409,
    "idempotency_key_reused": 422,
    "unavailable": 503,
}


async def _require_integers(request: Request[Any, Any, Any], fields: tuple[str, ...]) -> None:
    """Litestar converts bodies leniently ("1" and 1.0 become 1); a quantity must be a JSON
    integer. Reads the JSON Litestar already parsed (no second decode)."""
    raw = await request.json()
    for field in fields:
        if type(raw.get(field)) is not int:
            raise field_error(field, "Expected `int`")


class OrderController(Controller):
    path = "/orders"
    tags = ["orders"]

    @post("/", status_code=202, summary="Buy: reserve stock and queue the order")
    async def create_order(
        self,
        request: Request[User, Any, Any],
        data: JSONBody[PurchaseRequest],
        resources: NamedDependency[Resources],
        idempotency_key: Annotated[str | None, HeaderParameter(name="Idempotency-Key", required=False)] = None,
    ) -> Response[OrderAccepted]:
        """Buy: ``{"product_id", "quantity"}`` (units) -> 202 ``OrderAccepted`` with ``Location``, only
        after the broker confirmed. ``Idempotency-Key`` (IETF Idempotency-Key draft, 1-64 visible
        ASCII) makes retries safe. Errors (RFC 9457 problem+json, ``code``): 400 invalid_request /
        invalid_idempotency_key, 401, 404 product_not_found, 409 sold_out / limit_exceeded /
        sale_not_active / request_in_progress, 422 idempotency_key_reused, 503 unavailable."""
        await _require_integers(request, ("product_id", "quantity"))
        user = request.user
        if idempotency_key is None:
            request_id = mint_request_id()
        elif is_valid_idempotency_key(idempotency_key):
            request_id = request_id_from_key(user.id, data.product_id, idempotency_key)
        else:
            raise field_error("Idempotency-Key", "must be 1-64 visible ASCII characters", "invalid_idempotency_key")
        try:
            accepted = await resources.purchases.purchase(user.id, data.product_id, data.quantity, request_id)
        except PurchaseRejected as rejected:
            raise await self._problem(resources, data, rejected) from None
        body = OrderAccepted(accepted.order_no, accepted.request_id, "queued", accepted.product_id, accepted.quantity)
        return Response(body, status_code=202, headers={"Location": f"/api/v1/orders/{accepted.order_no}"})

    @staticmethod
    async def _problem(resources: Resources, data: PurchaseRequest, rejected: PurchaseRejected) -> Problem:
        if rejected.code == "quantity_over_limit":
            return field_error("quantity", rejected.detail)
        if rejected.code == "not_loaded":
            # Off the hot path: only a product Redis does not know costs a MySQL look-up.
            if not await product_exists(resources.engine, data.product_id):
                return Problem(404, "product_not_found", f"Product {data.product_id} does not exist.")
            return Problem(503, "unavailable", "Stock is not loaded yet, retry shortly.", headers={"Retry-After": "1"})
        headers = {"Retry-After": "1"} if rejected.code == "unavailable" else None
        return Problem(_STATUS[rejected.code], rejected.code, rejected.detail, headers=headers)

    @get("/", summary="Your orders, newest first (keyset pages)")
    async def list_orders(
        self,
        request: Request[User, Any, Any],
        resources: NamedDependency[Resources],
        limit: Annotated[int, QueryParameter(ge=1, le=100)] = 20,
        cursor: FromQuery[str | None] = None,
    ) -> OrderPage:
        """The caller's orders in MySQL, newest first, ``limit`` per page; 400 for a foreign ``cursor``."""
        try:
            return await list_orders(resources.engine, request.user.id, limit, cursor)
        except BadCursor:
            raise field_error("cursor", "not a cursor this service handed out") from None

    @post("/{order_no:str}/cancel", status_code=200, summary="Cancel your unpaid order; its units go back on sale")
    async def cancel(
        self, request: Request[User, Any, Any], order_no: FromPath[str], resources: NamedDependency[Resources]
    ) -> OrderView:
        """Cancel the caller's unpaid order; 404 order_not_found, 409 order_not_cancellable."""
        require_order_no(order_no)
        try:
            returned = await cancel_order(resources.engine, order_no, "buyer_cancelled", owner=request.user.id)
        except OrderNotFound:
            if await find_order(resources.engine, resources.store, request.user.id, order_no) is not None:
                raise Problem(
                    409, "order_not_cancellable", "The order is still queued; retry in a moment.", headers={"Retry-After": "1"}
                ) from None
            raise Problem(404, "order_not_found", f"No order {order_no}.") from None
        except TransitionLost as lost:
            raise Problem(409, "order_not_cancellable", f"The order is {lost.current.label}.") from None
        await give_back_to_redis(resources.store, returned)
        view = await find_order(resources.engine, resources.store, request.user.id, order_no)
        assert view is not None
        return view

    @get("/{order_no:str}", summary="Read one of your orders")
    async def get_order(
        self, request: Request[User, Any, Any], order_no: FromPath[str], resources: NamedDependency[Resources]
    ) -> OrderView:
        """The caller's order with its status history; 400 invalid_order_no, 404 order_not_found."""
        require_order_no(order_no)
        view = await find_order(resources.engine, resources.store, request.user.id, order_no)
        if view is None:
            raise Problem(404, "order_not_found", f"No order {order_no}.")
        return view
