"""Order lifecycle after the purchase: the whitelisted state machine, cancellation (by the buyer or
the payment timeout), and giving returned units back to Redis.

Every status change is one conditional ``UPDATE orders ... WHERE order_no = ? AND status = ?``
plus its ``order_status_log`` row in the same transaction. Losing the race (no row matched) is
reported as :class:`TransitionLost`, never retried blindly. (MySQL dialects count matched rows;
with the status in the WHERE clause a matched row is a changed row.)
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import structlog
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from db.models import OrderStatus as S
from db.queries import attempts, inventory, orders
from service import metrics
from service.adapters.redis.stores import RedisStores
from service.domain.errors import OrderNotFound
from service.domain.orders import actors
from service.domain.purchase import user_quota
from service.domain.stock.buckets import bucket_of
from service.failures import StoreFailure
from service.model.stock import RestockOutcome

log = structlog.get_logger(__name__)

ALLOWED: dict[S, frozenset[S]] = {
    S.PENDING_PAYMENT: frozenset({S.PAID, S.CANCELLED, S.REJECTED}),
    S.PAID: frozenset({S.SHIPPED, S.REFUNDING}),
    S.SHIPPED: frozenset({S.COMPLETED}),
    S.REFUNDING: frozenset({S.REFUNDED, S.PAID}),
}
"""The whitelist: from-status -> allowed to-statuses. Cancelled, completed, refunded and
rejected are final; ``refunding -> paid`` when the channel fails or rejects the refund."""


class PaymentOpen(Exception):
    """The order has a payment attempt still open at a channel: it may be paid there, so it is
    not cancelled (the channel must close it first; see :mod:`service.domain.payments.checkout`)."""

    def __init__(self, order_no: str) -> None:
        super().__init__(f"order {order_no} has a payment open at a channel")
        self.order_no = order_no


class IllegalTransition(ValueError):
    """The whitelist does not allow this change."""


class TransitionLost(Exception):
    """The order was no longer in the expected status: another change won the race.
    ``current`` is the status it has now."""

    def __init__(self, order_no: str, current: S) -> None:
        super().__init__(f"order {order_no} is {current.label}")
        self.order_no = order_no
        self.current = current


@dataclass(frozen=True, slots=True)
class OrderRow:
    """The columns the lifecycle needs (amount in minor units, quantity in units)."""

    id: int
    order_no: str
    user_id: str
    product_id: int
    quantity: int
    amount: int
    status: S


@dataclass(frozen=True, slots=True)
class ReturnedUnits:
    """Units given back to MySQL stock by a committed change, to be given back to Redis too.
    ``inventory_version`` is the inventory row's version after that commit; ``release_quota``:
    the buyer's per-user quota goes back too (a cancel; not a refund: the buyer did buy);
    ``bucket``: the buyer's stock bucket, where the units and the quota go back in Redis."""

    order_no: str
    user_id: str
    product_id: int
    quantity: int
    inventory_version: int
    release_quota: bool
    bucket: int = 0


async def load_order(conn: AsyncConnection, order_no: str, *, for_update: bool = False) -> OrderRow | None:
    """The order ``order_no`` (row-locked with ``for_update``), or None."""
    row = (await conn.execute(orders.lifecycle_row(for_update=for_update), {"o": order_no})).first()
    if row is None:
        return None
    return OrderRow(row.id, row.order_no, row.user_id, row.product_id, row.quantity, row.amount, S(row.status))


async def transition(
    conn: AsyncConnection, order_no: str, from_: S, to: S, reason: str | None = None, *, actor: str
) -> None:
    """Change ``order_no`` from ``from_`` to ``to`` inside the caller's transaction and log it with
    ``reason`` and ``actor`` (who: :mod:`service.domain.orders.actors`).

    Raises:
        IllegalTransition: ``to`` is not allowed after ``from_``.
        TransitionLost: the order was not in ``from_`` any more (or does not exist).
    """
    if to not in ALLOWED.get(from_, frozenset()):
        raise IllegalTransition(f"{from_.label} -> {to.label} is not allowed")
    changed = await conn.execute(
        orders.TRANSITION,
        {"to": to, "reason": reason, "o": order_no, "from_": from_},
    )
    if changed.rowcount != 1:
        current = (await conn.execute(orders.STATUS, {"o": order_no})).scalar()
        raise TransitionLost(order_no, S(current) if current is not None else from_)
    await conn.execute(
        orders.LOG_TRANSITION,
        {"from_": from_, "to": to, "reason": reason, "actor": actor, "o": order_no},
    )


async def return_stock(conn: AsyncConnection, order: OrderRow, *, release_quota: bool) -> ReturnedUnits:
    """``stock + q, sold - q`` for the order's product inside the caller's transaction; with
    ``release_quota`` (a cancel) the buyer's count against the per-user limit in MySQL goes down
    by ``q`` too (after the inventory row: :mod:`service.domain.purchase.user_quota`'s lock order)."""
    await conn.execute(
        inventory.GIVE_BACK,
        {"q": order.quantity, "p": order.product_id},
    )
    if release_quota:
        await user_quota.take_back(conn, order.product_id, {order.user_id: order.quantity})
    version, buckets = (await conn.execute(inventory.VERSION, {"p": order.product_id})).one()
    return ReturnedUnits(
        order.order_no,
        order.user_id,
        order.product_id,
        order.quantity,
        version,
        release_quota,
        bucket_of(order.user_id, buckets),
    )


async def cancel_order(
    engine: AsyncEngine, order_no: str, reason: str, *, actor: str, owner: str | None = None
) -> ReturnedUnits:
    """Cancel a ``pending_payment`` order and return its units to MySQL stock, one transaction.

    ``owner``: when given, only that user's order can be cancelled. ``reason`` is logged
    (``buyer_cancelled``, ``payment_timeout``) with ``actor``.

    Raises:
        OrderNotFound: unknown, or not ``owner``'s.
        TransitionLost: the order is no longer pending payment (paid, cancelled, ...).
        PaymentOpen: a payment attempt of the order is still open at a channel (a start that
            came after the channels were asked).
    """
    async with engine.begin() as conn:
        order = await load_order(conn, order_no, for_update=True)
        if order is None or (owner is not None and order.user_id != owner):
            raise OrderNotFound(order_no)
        if (await conn.execute(attempts.ANY_OPEN, {"o": order_no})).first() is not None:
            raise PaymentOpen(order_no)
        await transition(conn, order_no, S.PENDING_PAYMENT, S.CANCELLED, reason, actor=actor)
        returned = await return_stock(conn, order, release_quota=True)
    log.info("order_cancelled", order_no=order_no, reason=reason, quantity=order.quantity)
    return returned


async def give_back_to_redis(store: RedisStores, returned: ReturnedUnits) -> RestockOutcome | None:
    """Return the units (and, for a cancel, the buyer's quota) to Redis, exactly once
    (:meth:`~service.adapters.redis.reservations.Reservations.restock`).

    Returns ``RETURNED``, ``DONE`` (already given back), ``REALIGNED`` (a realignment counted
    them already) or None (Redis error, logged: the next realignment restores them from MySQL).
    """
    try:
        return await store.reservations.restock(
            returned.product_id,
            returned.order_no,
            returned.user_id,
            returned.quantity,
            returned.inventory_version,
            release_quota=returned.release_quota,
            bucket=returned.bucket,
        )
    except StoreFailure as exc:
        log.warning("restock_failed", order_no=returned.order_no, error=repr(exc))
        return None


async def expire_unpaid(
    engine: AsyncEngine,
    store: RedisStores,
    window_seconds: int,
    *,
    product_id: int | None = None,
    batch: int = 500,
    may_cancel: Callable[[str], Awaitable[bool]] | None = None,
) -> int:
    """One sweep: cancel every order (of ``product_id``, or of every product) still
    ``pending_payment`` ``window_seconds`` after it was created (reason ``payment_timeout``) and
    give its units back. ``may_cancel(order_no)`` is asked first (the channels: a payment found
    there pays the order instead; an order whose channel cannot confirm it is unpaid is left for
    the next sweep). Returns how many it cancelled; an order paid in the meantime loses nothing
    (the conditional update skips it)."""
    cancelled = 0
    after_id = 0
    while True:
        async with engine.connect() as conn:
            due = (
                await conn.execute(
                    orders.due_unpaid(one_product=product_id is not None),
                    {
                        "pending": S.PENDING_PAYMENT,
                        "product": product_id,
                        "window": window_seconds,
                        "batch": batch,
                        "after": after_id,
                    },
                )
            ).all()
        for order_id, order_no in due:
            after_id = order_id
            if may_cancel is not None and not await may_cancel(order_no):
                continue
            try:
                returned = await cancel_order(engine, order_no, "payment_timeout", actor=actors.SWEEP)
            except (TransitionLost, PaymentOpen):
                continue
            await give_back_to_redis(store, returned)
            metrics.SWEPT.inc()  # here, not at the CLI: the sale's in-process sweep counts too
            cancelled += 1
        if len(due) < batch:
            return cancelled
