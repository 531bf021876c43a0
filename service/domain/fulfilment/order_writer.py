"""The authoritative write of queued orders into MySQL: a batch of deliveries in one transaction.

The brief's per-message rules ("Consumer (authoritative write)"), applied to a batch at once:

1. Claim (:class:`OrderWriter`): one ``lua/claim.lua`` call per product in the batch (its keys
   live in that product's ``{p:ID}`` slot), run concurrently: one round trip. A message whose
   own attempt's reservation was ``released`` (the API gave it back and answered 503) is
   dropped, nothing written. Anything else without a journal entry (Redis lost or rolled back
   its data, or Redis is away) is written as far as MySQL allows: its unique request id and
   conditional stock UPDATE decide, never state Redis can lose.
2. One transaction (:func:`write_orders`):
   - one multi-row ``INSERT ... SELECT`` of the orders (``pending_payment``) under
     ``UNIQUE(request_id)`` and ``UNIQUE(order_no)``; a row naming an unknown product inserts
     nothing. A 1062 fails the statement: one locking SELECT finds which rows collided, those
     are settled, the rest inserted again (the duplicate is caught on the insert, never looked
     for first). A collided order whose order number is already written under its request id
     was applied before: ``DUPLICATE``, no second decrement. A request id taken with a new order
     number is a key reused after its replay record expired: the order is written under a
     reissued request id, and recorded ``rejected``/``duplicate_request`` when the first order
     is younger than the replay window (Redis lost the record: never a second purchase).
   - the ``order_status_log`` rows of the batch (one multi-row insert);
   - per product, in product id order (one lock order for every consumer), one
     ``UPDATE inventory ... WHERE stock >= <batch total>``, then the per-user limit in MySQL
     (:mod:`service.domain.purchase.user_quota`): one multi-row upsert of the batch's units per user into
     ``user_quota`` and one read of the users it took over the product's limit. When both pass
     (the common case: three statements per product), done. Else the orders are decided one by
     one in delivery order: an order that would take its user over the limit is recorded
     ``rejected``/``limit_exceeded`` (even when Redis lost the buyer's quota and let it through),
     one that does not fit the stock left ``rejected``/``sold_out`` (the inventory row is locked
     and read first when the stock did not cover the batch), the others take their units; the
     quota counts and the stock are set to exactly what the kept orders take;
   - an order whose order number another request's order already has (a minter fault) is
     recorded ``rejected``/``order_no_conflict`` under a stand-in number, and the buyer's number
     leads to it (:mod:`service.domain.order_numbers.conflicts`): never a dead letter, never a 202
     without a row the buyer can read;
   - deadlock (1213) or lock wait timeout (1205): the whole transaction is retried, bounded,
     with backoff.
   Repeats inside one batch (the same request id or order number twice) are written in a later
   round of the same transaction, where they meet the first copy's row like any other repeat.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

import structlog
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from db.engine import DriverStatement, in_transaction, on_driver
from db.models import OrderStatus
from db.queries import inventory, orders, quota
from db.queries.json_rows import json_rows
from service import metrics
from service.adapters.redis.stores import RedisStores
from service.domain.order_numbers.conflicts import stand_in_order_no
from service.domain.orders.actors import CONSUMER
from service.domain.purchase import user_quota
from service.domain.purchase.request_id import reissued_request_id
from service.failures import DuplicateKey, StoreFailure
from service.model.order_message import OrderMessage
from service.model.stock import ClaimOutcome

_WRITE_RETRIED = metrics.retry_counter("write_orders", metrics.TRANSACTION_RETRIES.inc)
# Statements every batch runs, on the driver (db.engine.on_driver). The stock UPDATE, where a batch
# waits for the product's row lock, stays on the engine with the rest: its lock waits and deadlocks
# reach the engine's handle_error listeners as every other transaction's do.
_INSERT_MANY = DriverStatement(orders.INSERT_MANY)
_LOG_MANY = DriverStatement(orders.LOG_MANY)

log = structlog.get_logger(__name__)


class Outcome(Enum):
    """What one message did (the consumer acks, requeues or drops it by this)."""

    APPLIED = "applied"  # order pending_payment, stock taken
    # order rejected (sold_out, limit_exceeded, duplicate_request or order_no_conflict), no stock taken
    REJECTED = "rejected"
    DUPLICATE = "duplicate"  # already applied before; nothing written
    UNKNOWN_PRODUCT = "unknown_product"  # nothing written
    CONFLICT = "conflict"  # neither its order number nor its stand-in could be written; nothing written
    RELEASED = "released"  # the API gave the reservation back; nothing written


class OrderWriter:
    """Claims a batch of orders in Redis, then writes it to MySQL in one transaction."""

    def __init__(self, engine: AsyncEngine, store: RedisStores, replay_window_seconds: int = 86_400) -> None:
        self._engine = engine
        self._store = store
        self._replay_window = replay_window_seconds

    async def write(self, batch: Sequence[OrderMessage]) -> list[Outcome]:
        """One outcome per order of ``batch`` (delivery order), after the commit.

        Raises:
            service.failures.StoreFailure: MySQL failed (unavailable, or a deadlock's retries
                exhausted; nothing of the batch is written). Any other database error too.
        """
        released = await self._released(batch)
        kept = [order for order, gone in zip(batch, released, strict=True) if not gone]
        written = iter(await write_orders(self._engine, kept, self._replay_window) if kept else [])
        return [Outcome.RELEASED if gone else next(written) for gone in released]

    async def _released(self, batch: Sequence[OrderMessage]) -> list[bool]:
        """Claim every reservation of ``batch`` (one script call per product and stock bucket,
        concurrently); True for the messages whose own attempt the API released."""
        by_bucket: dict[tuple[int, int], list[int]] = defaultdict(list)
        for index, order in enumerate(batch):
            by_bucket[order.product_id, order.bucket].append(index)
        try:
            answers = await asyncio.gather(
                *(
                    self._store.reservations.claim_many(
                        product_id, [(batch[i].request_id, batch[i].attempt) for i in indexes], bucket=bucket
                    )
                    for (product_id, bucket), indexes in by_bucket.items()
                )
            )
        except StoreFailure as exc:
            # Without Redis, MySQL's unique request id still decides: never drop an order for it.
            log.warning("claim_failed", orders=len(batch), error=repr(exc))
            return [False] * len(batch)
        released = [False] * len(batch)
        for indexes, outcomes in zip(by_bucket.values(), answers, strict=True):
            for index, outcome in zip(indexes, outcomes, strict=True):
                released[index] = outcome is ClaimOutcome.RELEASED
        return released


async def apply_order(engine: AsyncEngine, order: OrderMessage, replay_window_seconds: int = 86_400) -> Outcome:
    """:func:`write_orders` for one order (no Redis claim)."""
    return (await write_orders(engine, [order], replay_window_seconds))[0]


async def write_orders(
    engine: AsyncEngine, batch: Sequence[OrderMessage], replay_window_seconds: int = 86_400
) -> list[Outcome]:
    """Write ``batch`` in one transaction (see the module docstring); one outcome per order, in
    order. The whole transaction is retried on 1213/1205 (:func:`db.engine.in_transaction`).

    ``replay_window_seconds`` is how long the API keeps replay records
    (``FLASHSALE_ORDERS__REPLAY_TTL_SECONDS``): a request id taken by an order younger than that,
    arriving with a new order number, is a retry the API could not recognise (its replay
    record was lost with Redis data) and is recorded ``rejected``/``duplicate_request``.

    Raises:
        service.failures.StoreFailure: MySQL failed (unavailable, or a deadlock's retries exhausted).
    """
    return await in_transaction(
        engine,
        lambda conn: _write(conn, batch, replay_window_seconds),
        label=f"write_orders({len(batch)})",
        on_retry=_WRITE_RETRIED,
    )


@dataclass(slots=True)
class _Row:
    """One order on its way into ``orders``: its place in the batch, the request id it is written
    under (its own, or reissued), the order number it is written under (its own, or the stand-in
    of an order whose number another request's order has: ``conflict``), and the reason it is
    rejected without taking stock, if any."""

    index: int
    order: OrderMessage
    request_id: str
    order_no: str
    rejected_as: str | None = None
    conflict: bool = False


async def _write(conn: AsyncConnection, batch: Sequence[OrderMessage], replay_window: int) -> list[Outcome]:
    """The transaction's work, in rounds of orders that repeat no request id nor order number."""
    outcomes: list[Outcome | None] = [None] * len(batch)
    todo = list(range(len(batch)))
    while todo:
        seen: set[str] = set()
        now: list[_Row] = []
        later: list[int] = []
        for index in todo:
            order = batch[index]
            if order.request_id in seen or order.order_no in seen:
                later.append(index)
            else:
                seen.update((order.request_id, order.order_no))
                now.append(_Row(index, order, order.request_id, order.order_no))
        await _write_round(conn, now, outcomes, replay_window)
        todo = later
    assert all(outcome is not None for outcome in outcomes)
    return [outcome for outcome in outcomes if outcome is not None]


async def _write_round(
    conn: AsyncConnection, rows: list[_Row], outcomes: list[Outcome | None], replay_window: int
) -> None:
    """Insert ``rows`` (no two share a request id or order number), log them, take their stock
    or reject them; every row gets its outcome."""
    written = await _insert(conn, rows, outcomes, replay_window)
    if not written:
        return
    request_ids = json_rows([[row.request_id] for row in written])
    created = {"from_": None, "to": OrderStatus.PENDING_PAYMENT, "reason": None, "actor": CONSUMER, "rows": request_ids}
    await on_driver(conn, _LOG_MANY, created)
    conflicts = [[row.request_id, row.order.order_no, row.order.user_id] for row in written if row.conflict]
    if conflicts:
        await conn.execute(quota.RECORD_CONFLICT, {"rows": json_rows(conflicts)})
    rejected: dict[str, list[_Row]] = defaultdict(list)
    by_product: dict[int, list[_Row]] = defaultdict(list)
    for row in written:
        if row.rejected_as is not None:
            rejected[row.rejected_as].append(row)
        else:
            by_product[row.order.product_id].append(row)
    for product_id in sorted(by_product):
        taken = await _take_stock(conn, product_id, by_product[product_id])
        for row in taken.fit:
            outcomes[row.index] = Outcome.APPLIED
        rejected["sold_out"].extend(taken.sold_out)
        rejected["limit_exceeded"].extend(taken.over_limit)
    for reason, rows_rejected in rejected.items():
        if rows_rejected:
            await _reject(conn, rows_rejected, reason)
            for row in rows_rejected:
                outcomes[row.index] = Outcome.REJECTED


async def _insert(
    conn: AsyncConnection, rows: list[_Row], outcomes: list[Outcome | None], replay_window: int
) -> list[_Row]:
    """INSERT ``rows`` (one statement); returns the rows written. Rows that collided with an
    existing order, and rows of unknown products, get their outcome and are not returned."""
    while rows:
        payload = json_rows(
            [
                [r.order_no, r.request_id, r.order.user_id, r.order.product_id, r.order.quantity, r.order.amount]
                for r in rows
            ]
        )
        try:
            inserted, _ = await on_driver(conn, _INSERT_MANY, {"rows": payload, "status": OrderStatus.PENDING_PAYMENT})
        except DuplicateKey:
            before = [(row.index, row.request_id, row.order_no) for row in rows]
            rows = await _settle_collisions(conn, rows, outcomes, replay_window)
            if [(row.index, row.request_id, row.order_no) for row in rows] == before:
                raise  # no row of ours collided with a written order: not a repeat, let it fail
            continue
        if inserted == len(rows):
            return rows
        present = set((await conn.execute(orders.PRESENT_REQUEST_IDS, {"r": [r.request_id for r in rows]})).scalars())
        for row in rows:
            if row.request_id not in present:
                outcomes[row.index] = Outcome.UNKNOWN_PRODUCT
        return [row for row in rows if row.request_id in present]
    return []


async def _settle_collisions(
    conn: AsyncConnection, rows: list[_Row], outcomes: list[Outcome | None], replay_window: int
) -> list[_Row]:
    """After a 1062: give the rows whose key is taken their outcome (or their reissued request
    id, or their stand-in order number); returns the rows to insert again."""
    taken = list(
        await conn.execute(
            orders.TAKEN,
            {"s": replay_window, "o": [r.order_no for r in rows], "r": [r.request_id for r in rows]},
        )
    )
    request_of_order_no = {found.order_no: found.request_id for found in taken}
    order_no_of_request = {found.request_id: found.order_no for found in taken}
    recent_by_request_id = {found.request_id: bool(found.recent) for found in taken}
    left: list[_Row] = []
    for row in rows:
        order = row.order
        stored = request_of_order_no.get(row.order_no)
        if stored is not None:
            # Written under its own (or its reissued) request id: applied before.
            if stored in (order.request_id, reissued_request_id(order.request_id, order.order_no)):
                outcomes[row.index] = Outcome.DUPLICATE
            elif row.conflict:
                outcomes[row.index] = Outcome.CONFLICT  # even the stand-in is taken: nothing can be written
            elif order_no_of_request.get(row.request_id) == stand_in_order_no(row.request_id):
                outcomes[row.index] = Outcome.DUPLICATE  # recorded order_no_conflict before
            else:
                # Another request's order has this number (the minter handed it out twice): the
                # order is recorded rejected under a stand-in number its buyer is led to.
                log.error(
                    "order_no_conflict",
                    request_id=order.request_id,
                    order_no=order.order_no,
                    taken_by=stored,
                    product_id=order.product_id,
                )
                row.order_no = stand_in_order_no(row.request_id)
                row.conflict = True
                row.rejected_as = "order_no_conflict"
                left.append(row)
        elif row.request_id in recent_by_request_id and row.request_id != order.request_id:
            outcomes[row.index] = Outcome.CONFLICT  # even the reissued request id is taken
        elif row.request_id in recent_by_request_id:
            # The request id is taken but this order number is new: the API took the request for
            # a new one because its replay record was gone. Every 202 gets its row, under a
            # reissued request id; whether it is a purchase depends on why the record was gone.
            row.request_id = reissued_request_id(order.request_id, order.order_no)
            if recent_by_request_id[order.request_id]:
                row.rejected_as = "duplicate_request"  # Redis lost a live record: never a second purchase
            left.append(row)
        else:
            left.append(row)
    return left


@dataclass(slots=True)
class _Taken:
    """How one product's orders of a round were decided (each list in delivery order)."""

    fit: list[_Row]
    sold_out: list[_Row]
    over_limit: list[_Row]


async def _take_stock(conn: AsyncConnection, product_id: int, rows: list[_Row]) -> _Taken:
    """Take the units of ``rows`` (one product, delivery order) and count them against the
    per-user limit in MySQL; the orders that do not fit the stock or would take their user over
    the limit take nothing and count nothing.

    One ``UPDATE inventory`` for the whole batch (it locks the inventory row, so the quota rows
    are always locked after it), one upsert into ``user_quota``, one read of the users now over
    the limit. When the stock did not cover the batch, or a user went over, the orders are
    decided one by one in delivery order (limit first: an order refused for the limit leaves its
    units to the orders behind it), the counts of the refused ones are taken back and the stock
    set to exactly what the kept ones take. (rowcount is matched rows on MySQL dialects; with
    ``stock >= q`` in the WHERE clause a matched row is a decrement.)"""
    total = sum(row.order.quantity for row in rows)
    took_all = (await conn.execute(inventory.TAKE, {"product_id": product_id, "quantity": total})).rowcount == 1
    left = None if took_all else (await conn.execute(inventory.STOCK_LOCKED, {"p": product_id})).scalar() or 0
    over = await user_quota.add_units(conn, product_id, _units_by_user(rows))
    if took_all and not over:
        return _Taken(rows, [], [])
    # What each user over the limit held before this batch; the others stay within it whatever they buy here.
    held = {
        user: state.bought - sum(r.order.quantity for r in rows if r.order.user_id == user)
        for user, state in over.items()
    }
    decided = _Taken([], [], [])
    for row in rows:
        user, quantity = row.order.user_id, row.order.quantity
        if user in over and held[user] + quantity > over[user].limit:
            decided.over_limit.append(row)
        elif left is not None and quantity > left:
            decided.sold_out.append(row)
        else:
            decided.fit.append(row)
            if user in held:
                held[user] += quantity
            if left is not None:
                left -= quantity
    await user_quota.take_back(conn, product_id, _units_by_user(decided.sold_out + decided.over_limit))
    if took_all:
        if returned := sum(row.order.quantity for row in decided.over_limit):
            await conn.execute(inventory.GIVE_BACK, {"q": returned, "p": product_id})
    elif decided.fit:
        units = sum(row.order.quantity for row in decided.fit)
        taken = await conn.execute(inventory.TAKE, {"product_id": product_id, "quantity": units})
        assert taken.rowcount == 1, "the locked inventory row changed"
    return decided


def _units_by_user(rows: list[_Row]) -> dict[str, int]:
    units: dict[str, int] = defaultdict(int)
    for row in rows:
        units[row.order.user_id] += row.order.quantity
    return dict(units)


async def _reject(conn: AsyncConnection, rows: list[_Row], reason: str) -> None:
    """``pending_payment -> rejected`` (a whitelisted change, :data:`service.domain.orders.lifecycle.ALLOWED`)
    for ``rows`` written in this transaction, with their history rows."""
    params = {
        "from_": OrderStatus.PENDING_PAYMENT,
        "to": OrderStatus.REJECTED,
        "reason": reason,
        "actor": CONSUMER,
        "r": [row.request_id for row in rows],
        "rows": json_rows([[row.request_id] for row in rows]),
    }
    changed = await conn.execute(orders.REJECT_MANY, params)
    assert changed.rowcount == len(rows), "an order written in this transaction changed status"
    await conn.execute(orders.LOG_MANY, params)
