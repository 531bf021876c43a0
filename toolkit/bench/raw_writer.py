"""Raw MySQL writers: the database's own ceiling for the consumer's writes, on the same tables.

Each order is written as the consumer writes it (:mod:`service.domain.fulfilment.order_writer`): the order
row (``pending_payment``), its ``order_status_log`` row, and ``UPDATE inventory ... WHERE stock
>= q``. ``connections`` asyncmy connections (no pool, no ORM) take work from one shared source:

- one order per transaction (:func:`write_orders` with ``per_tx=1``), the consumer's shape without its
  framework: INSERT ... SELECT from products, the log row, the conditional UPDATE, COMMIT;
- ``per_tx`` orders per transaction: one multi-row INSERT, one
  INSERT ... SELECT for their log rows, one ``UPDATE inventory ... WHERE stock >= <batch total>``.

Deadlocks (1213) and lock wait timeouts (1205) retry the transaction. Rates are orders per
second of wall time from the first transaction's start to the last commit.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

import asyncmy
from asyncmy.errors import OperationalError
from sqlalchemy.engine import make_url

from db.models import OrderStatus
from service.domain.order_numbers.format import compose_order_no
from service.domain.purchase.request_id import mint_request_id

RETRYABLE = {1205, 1213}
_COLUMNS = "(order_no, request_id, user_id, product_id, quantity, amount, status)"
_INSERT_ONE = f"INSERT INTO orders {_COLUMNS} SELECT %s, %s, %s, p.id, %s, %s, %s FROM products p WHERE p.id = %s"
_LOG_ONE = "INSERT INTO order_status_log (order_id, from_status, to_status, reason) VALUES (%s, NULL, %s, NULL)"
_TAKE = (
    "UPDATE inventory SET stock = stock - %s, sold = sold + %s, version = version + 1"
    " WHERE product_id = %s AND stock >= %s"
)


@dataclass(frozen=True, slots=True)
class RawOrder:
    """One order to write (``amount`` in minor currency units, ``quantity`` 1)."""

    order_no: str
    request_id: str
    user_id: str
    product_id: int
    amount: int


def make_orders(product_id: int, count: int, shard: int, price: int) -> list[RawOrder]:
    """``count`` distinct, valid orders of one unit each for ``product_id`` (order numbers on
    ``shard``, this second, sequence 1..count)."""
    second = datetime.now(UTC).strftime("%Y%m%d%H%M%S")
    return [
        RawOrder(compose_order_no("BN", second, shard, i), mint_request_id(), f"bench-{i % 1000}", product_id, price)
        for i in range(1, count + 1)
    ]


@dataclass(frozen=True, slots=True)
class WriterResult:
    """``orders`` written in ``seconds`` of wall time; per-transaction latency p50/p99 in ms."""

    orders: int
    transactions: int
    seconds: float
    p50_ms: float
    p99_ms: float
    retries: int


async def _connect(url: str) -> asyncmy.Connection:
    parsed = make_url(url)
    return await asyncmy.connect(
        host=parsed.host or "127.0.0.1",
        port=parsed.port or 3306,
        user=parsed.username or "root",
        password=parsed.password or "",
        database=parsed.database,
        autocommit=False,
    )


async def _one(cursor: asyncmy.cursors.Cursor, orders: list[RawOrder]) -> None:
    order = orders[0]
    pending = int(OrderStatus.PENDING_PAYMENT)
    await cursor.execute(
        _INSERT_ONE,
        (order.order_no, order.request_id, order.user_id, 1, order.amount, pending, order.product_id),
    )
    await cursor.execute(_LOG_ONE, (cursor.lastrowid, pending))
    if await cursor.execute(_TAKE, (1, 1, order.product_id, 1)) != 1:
        raise RuntimeError(f"product {order.product_id} ran out of stock")


async def _batch(cursor: asyncmy.cursors.Cursor, orders: list[RawOrder]) -> None:
    pending = int(OrderStatus.PENDING_PAYMENT)
    rows = ", ".join(["(%s, %s, %s, %s, 1, %s, %s)"] * len(orders))
    params = [v for o in orders for v in (o.order_no, o.request_id, o.user_id, o.product_id, o.amount, pending)]
    await cursor.execute(f"INSERT INTO orders {_COLUMNS} VALUES {rows}", params)
    marks = ", ".join(["%s"] * len(orders))
    await cursor.execute(
        "INSERT INTO order_status_log (order_id, from_status, to_status, reason)"
        f" SELECT id, NULL, %s, NULL FROM orders WHERE request_id IN ({marks})",
        [pending, *(o.request_id for o in orders)],
    )
    n = len(orders)
    if await cursor.execute(_TAKE, (n, n, orders[0].product_id, n)) != 1:
        raise RuntimeError(f"product {orders[0].product_id} ran out of stock")


async def _write(url: str, orders: list[RawOrder], per_tx: int, connections: int) -> WriterResult:
    chunks: Iterator[list[RawOrder]] = iter([orders[i : i + per_tx] for i in range(0, len(orders), per_tx)])
    write = _one if per_tx == 1 else _batch
    latencies: list[float] = []
    retries = 0

    async def worker(conn: asyncmy.Connection) -> None:
        nonlocal retries
        async with conn.cursor() as cursor:
            for chunk in chunks:  # shared iterator: each chunk goes to exactly one worker
                while True:
                    started = time.perf_counter()
                    try:
                        await conn.begin()
                        await write(cursor, chunk)
                        await conn.commit()
                        break
                    except OperationalError as exc:
                        await conn.rollback()
                        if exc.args[0] not in RETRYABLE:
                            raise
                        retries += 1
                latencies.append(time.perf_counter() - started)

    conns = [await _connect(url) for _ in range(connections)]
    try:
        started = time.perf_counter()
        await asyncio.gather(*(worker(c) for c in conns))
        seconds = time.perf_counter() - started
    finally:
        for conn in conns:
            conn.close()
    latencies.sort()

    def pct(q: float) -> float:
        return round(latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000, 2)

    return WriterResult(len(orders), len(latencies), seconds, pct(0.50), pct(0.99), retries)


async def write_orders(url: str, orders: list[RawOrder], per_tx: int = 1, connections: int = 8) -> WriterResult:
    """Write ``orders`` (one product), ``per_tx`` per transaction, over ``connections``
    connections: 1 is the consumer's shape, more is one multi-row transaction per chunk."""
    return await _write(url, orders, per_tx, connections)
