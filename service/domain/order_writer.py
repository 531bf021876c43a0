"""The authoritative write of one queued order into MySQL (the consumer's transaction).

Per message, one transaction: INSERT the order (``pending_payment``) under ``UNIQUE(request_id)``,
then ``UPDATE inventory SET stock = stock - q, sold = sold + q WHERE product_id = p AND stock >= q``.
A duplicate (1062 on the insert) whose order number is already written means the message was
applied before: roll back and ack, no second decrement. (A taken request id with a new order number
is a key reused after its replay record expired: the order is written under a reissued request id.)
An UPDATE that matches no row means MySQL has no stock: the order is recorded ``rejected`` (reason
``sold_out``) so the buyer sees a final answer. Deadlocks (1213) and lock wait timeouts (1205)
retry the whole transaction with backoff.
"""
from __future__ import annotations

import asyncio
import random
import re
from enum import Enum

import msgspec
import structlog
from sqlalchemy.engine import CursorResult
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from db.engine import DuplicateKeyError, as_duplicate_key, is_retryable
from db.models import MAX_AMOUNT, OrderStatus
from db.queries import inventory, orders
from service.adapters.broker import OrderMessage, decode_order
from service.domain.lifecycle import transition
from service.domain.order_no import is_valid_order_no
from service.domain.request_id import USER_ID, reissued_request_id

log = structlog.get_logger(__name__)

MAX_TRANSACTION_ATTEMPTS = 6
_REQUEST_ID = re.compile(r"[0-9a-f]{32}")



class Outcome(Enum):
    """What one message did to MySQL."""

    APPLIED = "applied"  # order pending_payment, stock taken
    REJECTED = "rejected"  # order rejected/sold_out, no stock taken
    DUPLICATE = "duplicate"  # already applied before; nothing written
    UNKNOWN_PRODUCT = "unknown_product"  # nothing written


class InvalidOrder(ValueError):
    """A message that is not a well-formed order; it is dead-lettered at once."""


class _Rollback(Exception):
    def __init__(self, outcome: Outcome) -> None:
        self.outcome = outcome


def parse_order(body: bytes) -> OrderMessage:
    """Decode and check a message body.

    Raises:
        InvalidOrder: not JSON of the order shape, or a field out of its domain.
    """
    try:
        order = decode_order(body)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise InvalidOrder(str(exc)) from exc
    if not (
        _REQUEST_ID.fullmatch(order.request_id)
        and is_valid_order_no(order.order_no)
        and USER_ID.fullmatch(order.user_id)
        and order.product_id > 0
        and order.quantity > 0
        and 0 <= order.amount <= MAX_AMOUNT
    ):
        raise InvalidOrder("field out of domain")
    return order


async def apply_order(engine: AsyncEngine, order: OrderMessage, replay_window_seconds: int = 86_400) -> Outcome:
    """Write one order in one transaction (see the module docstring); retried on 1213/1205.

    ``replay_window_seconds`` is how long the API keeps replay records
    (``FLASHSALE_ORDERS__REPLAY_TTL_SECONDS``): a request id taken by an order younger than that,
    arriving with a new order number, is a retry the API could not recognise (its replay
    record was lost with Redis data) and is recorded ``rejected``/``duplicate_request``.

    Raises:
        sqlalchemy.exc.DBAPIError: a non-retryable database error, or retries exhausted.
        db.engine.DuplicateKeyError: the order number exists under another request id (a real
            collision, which the shard lease should make impossible; the UNIQUE index stops it).
    """
    for attempt in range(1, MAX_TRANSACTION_ATTEMPTS + 1):
        try:
            return await _apply_once(engine, order, replay_window_seconds)
        except DBAPIError as exc:
            if not is_retryable(exc) or attempt == MAX_TRANSACTION_ATTEMPTS:
                raise
            delay = min(0.02 * 2**attempt, 1.0) * (0.5 + random.random())
            log.info("transaction_retry", request_id=order.request_id, attempt=attempt, delay=round(delay, 3))
            await asyncio.sleep(delay)
    raise AssertionError("unreachable")


async def _apply_once(engine: AsyncEngine, order: OrderMessage, replay_window_seconds: int) -> Outcome:
    try:
        async with engine.begin() as conn:
            inserted = await _insert(conn, order, order.request_id)
            if inserted is None:
                stored = await _request_id_of(conn, order.order_no)
                if stored in (order.request_id, reissued_request_id(order.request_id, order.order_no)):
                    raise _Rollback(Outcome.DUPLICATE)
                if stored is not None:
                    # Another request holds this order number: the UNIQUE index stops a collision
                    # the shard lease should make impossible.
                    raise DuplicateKeyError("uq_orders_order_no", f"order number {order.order_no} is taken")
                # The request id is taken but this order number is new: the API took the request
                # for a new one because its replay record was gone. Every 202 gets its row, under a
                # reissued request id; whether it is a purchase depends on why the record was gone.
                retry_of_live_order = await _taken_within(conn, order.request_id, replay_window_seconds)
                inserted = await _insert(conn, order, reissued_request_id(order.request_id, order.order_no))
                if inserted is None:
                    raise DuplicateKeyError(None, f"request {order.request_id} cannot be written")
                if retry_of_live_order and inserted.rowcount == 1:
                    # The record should still have been there: Redis lost it, and this is a retry of
                    # an order that exists. Never a second purchase for one request.
                    await _log_created(conn, inserted.lastrowid)
                    await transition(
                        conn, order.order_no, OrderStatus.PENDING_PAYMENT, OrderStatus.REJECTED, "duplicate_request"
                    )
                    return Outcome.REJECTED
                # Older than the replay window: the key was reused after it expired, a new purchase.
            if inserted.rowcount == 0:
                raise _Rollback(Outcome.UNKNOWN_PRODUCT)
            await _log_created(conn, inserted.lastrowid)
            # rowcount is matched rows on MySQL dialects; matched is what "had stock" means here.
            if (await conn.execute(inventory.TAKE, {"product_id": order.product_id, "quantity": order.quantity})).rowcount == 1:
                return Outcome.APPLIED
            await transition(conn, order.order_no, OrderStatus.PENDING_PAYMENT, OrderStatus.REJECTED, "sold_out")
            return Outcome.REJECTED
    except _Rollback as rollback:
        return rollback.outcome


async def _insert(conn: AsyncConnection, order: OrderMessage, request_id: str) -> CursorResult | None:
    """INSERT the order (``pending_payment``); None when a UNIQUE index refused it (1062)."""
    params = {
        "order_no": order.order_no,
        "request_id": request_id,
        "user_id": order.user_id,
        "product_id": order.product_id,
        "quantity": order.quantity,
        "amount": order.amount,
        "status": OrderStatus.PENDING_PAYMENT,
    }
    try:
        return await conn.execute(orders.INSERT, params)
    except IntegrityError as exc:
        if as_duplicate_key(exc) is None:
            raise
        return None


async def _log_created(conn: AsyncConnection, order_id: int) -> None:
    await conn.execute(
        orders.LOG_CREATED, {"order_id": order_id, "from_status": None, "to_status": OrderStatus.PENDING_PAYMENT, "reason": None}
    )


async def _taken_within(conn: AsyncConnection, request_id: str, seconds: int) -> bool:
    """True when the order holding ``request_id`` was created less than ``seconds`` ago."""
    recent = await conn.execute(
        orders.TAKEN_WITHIN,
        {"s": seconds, "r": request_id},
    )
    return bool(recent.scalar())


async def _request_id_of(conn: AsyncConnection, order_no: str) -> str | None:
    stored = await conn.execute(orders.REQUEST_ID, {"o": order_no})
    return stored.scalar()


