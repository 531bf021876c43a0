"""A purchase in stock mode ``database``: MySQL alone sells the product (docs/ARCHITECTURE.md).

One MySQL transaction per purchase (:func:`buy_in_database`), in this order:

1. ``SELECT stock FROM inventory ... FOR UPDATE``: the product's inventory row is locked until
   the commit, so the purchases of one product are decided one at a time. That lock is what
   makes the per-user limit exact under concurrency (two requests of one user cannot both read
   "holds 0"), and what a mode switch takes before it changes ``products.stock_mode``.
2. The product's terms (price, per-user limit, stock mode, order token, sale window judged by
   MySQL's clock), read after the lock, so they include every switch committed before it. A
   product that is not in ``database`` mode any more answers ``MOVED``.
3. ``INSERT`` the order (``pending_payment``) under ``UNIQUE(request_id)``: a 1062 is a replay,
   caught on the insert itself, never looked for first; the earlier order is answered again
   (or ``KEY_REUSED`` when it differs).
4. Sale window, per-user limit (quantity alone first), stock, order token, then the user's
   units counted in ``user_quota`` and refused past the limit: the consumer's rule
   (:mod:`service.domain.purchase.user_quota`), so both stock modes keep one count in MySQL.
5. The conditional ``UPDATE inventory SET stock = stock - ?, sold = sold + ? WHERE product_id
   = ? AND stock >= ?`` and the order's first ``order_status_log`` row.

A rejection rolls the transaction back: nothing stays written. Deadlocks (1213) and lock wait
timeouts (1205) retry the whole transaction with back-off (:func:`db.engine.in_transaction`).
The statements are the consumer's (``db/queries``), so both modes write the same rows.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from db.engine import in_transaction
from db.models import OrderStatus, StockMode
from db.queries import inventory, orders, products
from db.queries.json_rows import json_rows
from service import metrics
from service.domain.orders import actors
from service.domain.purchase import user_quota
from service.failures import DuplicateKey
from service.model.stock import ReserveOutcome

_BUY_RETRIED = metrics.retry_counter("buy_in_database")


@dataclass(frozen=True, slots=True)
class DatabaseAnswer:
    """What one ``database``-mode purchase decided. ``outcome`` uses the reserve vocabulary:
    ``RESERVED`` (the order is written, ``pending_payment``), ``REPLAY`` (the request id's
    earlier order, ``status`` its status now), ``KEY_REUSED``, ``MOVED`` (the product is in
    ``redis`` mode), ``NOT_LOADED`` (no such product), ``SALE_NOT_ACTIVE``, ``OVER_LIMIT``,
    ``SOLD_OUT``, ``TOKEN_REQUIRED`` (the product needs an order token and none was consumed),
    ``LIMIT_EXCEEDED``. ``order_no`` and ``status`` (a status label) are set for ``RESERVED``
    and ``REPLAY`` only."""

    outcome: ReserveOutcome
    order_no: str = ""
    status: str = ""


@dataclass(frozen=True, slots=True)
class DatabasePurchase:
    """One purchase: ``quantity`` units of ``product_id`` for ``user_id`` under ``request_id``
    (32 hex), with candidate order number ``order_no``; ``token_taken`` when an order token
    was consumed for it."""

    user_id: str
    product_id: int
    quantity: int
    request_id: str
    order_no: str
    token_taken: bool = False


class _Refused(Exception):
    """Raised inside the transaction so that it rolls back; carries the answer."""

    def __init__(self, outcome: ReserveOutcome) -> None:
        super().__init__(outcome.value)
        self.outcome = outcome


async def buy_in_database(engine: AsyncEngine, purchase: DatabasePurchase) -> DatabaseAnswer:
    """Run ``purchase`` as one MySQL transaction (see the module docstring).

    Raises:
        service.failures.StoreFailure: MySQL failed (unavailable, or a deadlock's retries
            exhausted), or :class:`~service.failures.DuplicateKey` on the order number (a minter
            fault; ``UNIQUE(order_no)`` stopped it).
    """
    try:
        return await in_transaction(
            engine, lambda conn: _buy(conn, purchase), label="buy_in_database", on_retry=_BUY_RETRIED
        )
    except _Refused as refused:
        return DatabaseAnswer(refused.outcome)
    except DuplicateKey:
        earlier = await earlier_order(engine, purchase.request_id)
        if earlier is None:
            raise  # not the request id: the order number collided
        return _replay(earlier, purchase)


async def earlier_order(engine: AsyncEngine, request_id: str) -> tuple[str, int, int, int] | None:
    """``(order_no, product_id, quantity, status)`` of the order written under ``request_id``, or None."""
    async with engine.connect() as conn:
        row = (await conn.execute(orders.BY_REQUEST_ID, {"r": request_id})).first()
    return None if row is None else (row.order_no, row.product_id, row.quantity, row.status)


def _replay(earlier: tuple[str, int, int, int], purchase: DatabasePurchase) -> DatabaseAnswer:
    """The answer to a request id that already has an order: that order, or ``KEY_REUSED``."""
    order_no, product_id, quantity, status = earlier
    if (product_id, quantity) != (purchase.product_id, purchase.quantity):
        return DatabaseAnswer(ReserveOutcome.KEY_REUSED)
    return DatabaseAnswer(ReserveOutcome.REPLAY, order_no, OrderStatus(status).label)


def replay_of(earlier: tuple[str, int, int, int] | None, purchase: DatabasePurchase) -> DatabaseAnswer | None:
    """:func:`_replay` of ``earlier`` when there is one (a resubmitted order token whose token is gone)."""
    return None if earlier is None else _replay(earlier, purchase)


async def _buy(conn: AsyncConnection, p: DatabasePurchase) -> DatabaseAnswer:
    # The product row (shared) before the inventory row: the lock order of products.LOCKED.
    terms = (await conn.execute(products.PURCHASE_TERMS, {"id": p.product_id})).first()
    stock = (await conn.execute(inventory.STOCK_LOCKED, {"p": p.product_id})).scalar()
    if terms is None or stock is None:
        raise _Refused(ReserveOutcome.NOT_LOADED)
    if terms.stock_mode != StockMode.DATABASE:
        raise _Refused(ReserveOutcome.MOVED)
    if p.quantity > terms.per_user_limit:
        # Before the insert: the amount of a quantity within the limit fits a BIGINT (checked
        # when the product is set), a larger one may not.
        raise _Refused(ReserveOutcome.OVER_LIMIT)
    row = [p.order_no, p.request_id, p.user_id, p.product_id, p.quantity, terms.price * p.quantity]
    await conn.execute(orders.INSERT_MANY, {"rows": json_rows([row]), "status": OrderStatus.PENDING_PAYMENT})
    # The same order of checks as lua/reserve.lua: window, stock, token, the user's quota.
    if not terms.active:
        raise _Refused(ReserveOutcome.SALE_NOT_ACTIVE)
    if stock < p.quantity:
        raise _Refused(ReserveOutcome.SOLD_OUT)
    if terms.require_token and not p.token_taken:
        raise _Refused(ReserveOutcome.TOKEN_REQUIRED)
    if await user_quota.add_units(conn, p.product_id, {p.user_id: p.quantity}):  # counted under the inventory lock
        raise _Refused(ReserveOutcome.LIMIT_EXCEEDED)
    taken = await conn.execute(inventory.TAKE, {"product_id": p.product_id, "quantity": p.quantity})
    if taken.rowcount != 1:
        raise _Refused(ReserveOutcome.SOLD_OUT)
    created = {
        "from_": None,
        "to": OrderStatus.PENDING_PAYMENT,
        "reason": None,
        "actor": actors.buyer(p.user_id),
        "rows": json_rows([[p.request_id]]),
    }
    await conn.execute(orders.LOG_MANY, created)
    return DatabaseAnswer(ReserveOutcome.RESERVED, p.order_no, OrderStatus.PENDING_PAYMENT.label)
