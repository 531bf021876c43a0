"""Reading orders back: MySQL when it has the row, else Redis while the order is only queued."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import msgspec
from sqlalchemy import Row
from sqlalchemy.ext.asyncio import AsyncEngine

from db.models import OrderStatus
from db.queries import orders as queries
from db.queries import quota
from service.adapters.redis.stores import RedisStores
from service.domain.errors import Conflict, InvalidInput, OrderNotFound
from service.domain.order_numbers.format import require_valid_order_no
from service.domain.orders import actors
from service.domain.orders.lifecycle import PaymentOpen, TransitionLost, cancel_order, give_back_to_redis


class StatusChange(msgspec.Struct):
    """One entry of an order's status history (``from`` is None for the creation). ``actor``:
    who made the change (``buyer:<id>``, ``admin:<id>``, ``channel:<name>``, ``system:<job>``;
    None for changes logged before it was recorded)."""

    to: str
    at: datetime
    reason: str | None = None
    from_: str | None = msgspec.field(default=None, name="from")
    actor: str | None = None


class OrderView(msgspec.Struct):
    """An order as its owner sees it. ``status`` is ``queued`` while only Redis knows the order,
    then the MySQL status label; ``quantity`` in units; ``amount`` in minor currency units
    (None while queued); ``history`` oldest first."""

    order_no: str
    request_id: str
    status: str
    product_id: int
    quantity: int
    amount: int | None = None
    reason: str | None = None
    created_at: datetime | None = None
    history: list[StatusChange] = []


class OrderPage(msgspec.Struct):
    """A page of the caller's orders, newest first; pass ``next_cursor`` back for the next page
    (None on the last page)."""

    orders: list[OrderView]
    next_cursor: str | None


class BadCursor(InvalidInput):
    """A ``cursor`` that this service did not hand out (``invalid_request`` on ``cursor``)."""

    def __init__(self, cursor: str) -> None:
        super().__init__("cursor", "not a cursor this service handed out")


def _utc(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC)


def _view(row: Row[Any]) -> OrderView:
    return OrderView(
        order_no=row.order_no,
        request_id=row.request_id,
        status=OrderStatus(row.status).label,
        product_id=row.product_id,
        quantity=row.quantity,
        amount=row.amount,
        reason=row.reason,
        created_at=_utc(row.created_at),
    )


async def find_order(engine: AsyncEngine, store: RedisStores, user_id: str, order_no: str) -> OrderView | None:
    """The caller's order ``order_no`` with its status history, or None when unknown or someone
    else's. An order of the caller that was given a number another request's order had already
    taken is answered under that number (rejected, ``order_no_conflict``;
    :mod:`service.domain.order_numbers.conflicts`)."""
    async with engine.connect() as conn:
        row = (await conn.execute(queries.VIEW_BY_ORDER_NO, {"o": order_no})).first()
        if row is not None and row.user_id != user_id:
            # someone else's; the caller's own order under that number may still be queued
            row = (await conn.execute(quota.CONFLICT_OF_USER, {"o": order_no, "u": user_id})).first()
        if row is not None:
            log = await conn.execute(queries.HISTORY, {"id": row.id})
            view = _view(row)
            view.history = [
                StatusChange(
                    to=OrderStatus(entry.to_status).label,
                    at=_utc(entry.created_at),
                    reason=entry.reason,
                    from_=None if entry.from_status is None else OrderStatus(entry.from_status).label,
                    actor=entry.actor,
                )
                for entry in log
            ]
            return view
    queued = await store.reservations.queued_order(order_no)
    if queued is None or queued.user_id != user_id:
        return None
    return OrderView(
        order_no=order_no,
        request_id=queued.request_id,
        status="queued",
        product_id=queued.product_id,
        quantity=queued.quantity,
    )


def _encode_cursor(created_at: datetime, order_id: int) -> str:
    return base64.urlsafe_b64encode(f"{created_at.isoformat()}|{order_id}".encode()).decode().rstrip("=")


def _decode_cursor(cursor: str) -> tuple[datetime, int]:
    try:
        created_at, order_id = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode().split("|")
        position = datetime.fromisoformat(created_at), int(order_id)
    except (ValueError, binascii.Error, UnicodeDecodeError) as exc:
        raise BadCursor(cursor) from exc
    if position[0].tzinfo is not None or not 0 < position[1] < 2**63 or _encode_cursor(*position) != cursor:
        raise BadCursor(cursor)  # only the exact form this module writes is taken back
    return position


async def list_orders(engine: AsyncEngine, user_id: str, limit: int, cursor: str | None) -> OrderPage:
    """The caller's orders in MySQL, newest first, keyset-paginated on (created_at, id) over the
    ``(user_id, created_at)`` index; never another user's.

    Raises:
        BadCursor: ``cursor`` is not one this function returned.
    """
    params: dict[str, object] = {"u": user_id, "n": limit + 1}
    if cursor is not None:
        params["c"], params["i"] = _decode_cursor(cursor)
    async with engine.connect() as conn:
        rows = (await conn.execute(queries.page_of_user(after_cursor=cursor is not None), params)).all()
        page = rows[:limit]
        stood_in = [row.request_id for row in page if row.reason == "order_no_conflict"]
        given: dict[str, str] = {}
        if stood_in:
            given = {row.request_id: row.order_no for row in await conn.execute(quota.GIVEN_ORDER_NOS, {"r": stood_in})}
    next_cursor = _encode_cursor(page[-1].created_at, page[-1].id) if len(rows) > limit else None
    views = [_view(row) for row in page]
    for view in views:  # an order written under a stand-in number shows the number its buyer was given
        view.order_no = given.get(view.request_id, view.order_no)
    return OrderPage(orders=views, next_cursor=next_cursor)


class OrderService:
    """The buyer's use cases on their orders: read one, list, cancel. One instance per process.

    ``may_cancel(order_no)``: asked before a cancel (the channels: a payment found there pays
    the order instead, an attempt that cannot be closed there keeps it); None: always.
    """

    def __init__(
        self, engine: AsyncEngine, store: RedisStores, may_cancel: Callable[[str], Awaitable[bool]] | None = None
    ) -> None:
        self._engine = engine
        self._store = store
        self._may_cancel = may_cancel

    async def get(self, user_id: str, order_no: str) -> OrderView:
        """``user_id``'s order ``order_no`` with its status history.

        Raises:
            InvalidInput: ``invalid_order_no``.
            OrderNotFound: unknown, or someone else's.
        """
        require_valid_order_no(order_no)
        view = await find_order(self._engine, self._store, user_id, order_no)
        if view is None:
            raise OrderNotFound(order_no)
        return view

    async def page(self, user_id: str, limit: int, cursor: str | None) -> OrderPage:
        """One keyset page (``limit`` orders) of ``user_id``'s orders; raises :class:`BadCursor`."""
        return await list_orders(self._engine, user_id, limit, cursor)

    async def cancel(self, user_id: str, order_no: str) -> OrderView:
        """Cancel ``user_id``'s unpaid order; its units and the buyer's quota go back on sale.

        Raises:
            InvalidInput: ``invalid_order_no``.
            OrderNotFound: unknown, or someone else's.
            Conflict: ``order_not_cancellable`` (paid, cancelled, ...; paid at a channel; or
                still queued, or its payment at a channel could not be closed, with
                ``retry_after`` 1 s).
        """
        require_valid_order_no(order_no)
        if self._may_cancel is not None and (view := await self.get(user_id, order_no)).status == "pending_payment":
            if not await self._may_cancel(order_no):
                now = await self.get(user_id, order_no)
                if now.status != view.status:
                    raise Conflict(f"The order is {now.status}.", code="order_not_cancellable")
                raise Conflict(
                    "The payment at a channel could not be closed; retry in a moment.",
                    code="order_not_cancellable",
                    retry_after=1,
                )
        try:
            returned = await cancel_order(
                self._engine, order_no, "buyer_cancelled", actor=actors.buyer(user_id), owner=user_id
            )
        except OrderNotFound:
            found = await find_order(self._engine, self._store, user_id, order_no)
            if found is None:
                raise
            if found.status != "queued":  # written under a stand-in number: rejected, final
                raise Conflict(f"The order is {found.status}.", code="order_not_cancellable") from None
            raise Conflict(
                "The order is still queued; retry in a moment.", code="order_not_cancellable", retry_after=1
            ) from None
        except TransitionLost as lost:
            raise Conflict(f"The order is {lost.current.label}.", code="order_not_cancellable") from None
        except PaymentOpen:
            raise Conflict(
                "A payment of the order is open at a channel; retry in a moment.",
                code="order_not_cancellable",
                retry_after=1,
            ) from None
        await give_back_to_redis(self._store, returned)
        return await self.get(user_id, order_no)
