"""Switching a product between stock modes mid-sale, never overselling: selling from Redis
comes with a rollback plan, and this is that plan (docs/ARCHITECTURE.md).

``redis -> database`` (:func:`switch_to_database`):
1. The marker ``mode = database`` is written into the product's Redis sale terms: from then on
   ``reserve.lua`` answers ``moved`` and takes nothing (one HSET, atomic against every reserve).
2. The reservations already taken land: realignment passes (each drops the journal entries whose
   order row exists and re-publishes overdue ones) until the journal holds none unresolved, or
   ``drain_seconds`` have passed.
3. ``products.stock_mode = 'database'``, written with the product row locked: every
   ``database``-mode purchase reads the mode under a shared lock on that row, so none sells
   before this commit.
   Until then a purchase bounced by Redis finds MySQL still in ``redis`` mode and is answered
   ``503 unavailable`` (retry).
If Redis is down (the reason to switch), steps 1-2 are skipped: nothing can be reserved there.
API processes that still route the product to Redis follow at their next purchase (a failed
Redis call makes them read the mode from MySQL again, :mod:`service.domain.purchase.service`). A
reservation still in flight after ``drain_seconds`` (or when Redis was down) lands later through
the consumer's conditional UPDATE, which needs no Redis: it may be rejected ``sold_out``, it
cannot oversell; one Redis still holds unpublished is re-published by realignment once Redis
answers again.

``database -> redis`` (:func:`switch_to_redis`):
1. ``products.stock_mode = 'redis'`` with the product row locked: no ``database``-mode
   purchase takes stock after this commit (they answer ``moved`` and go to Redis, which still
   says ``moved`` until step 2: ``503``, retry).
2. Replay records for the orders written in ``database`` mode within the replay window, so that
   a retry with the same Idempotency-Key (or Order-Token) is answered with its order, not taken
   as a new purchase (the marker still stands: nothing is reserved meanwhile).
3. A realignment pass whose snapshot follows that commit loads Redis (stock = MySQL stock -
   reservations in flight, quotas, terms) and removes the marker in the same atomic write.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict

import structlog
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from db.engine import in_transaction
from db.models import StockMode
from db.queries import inventory, orders, products
from service import metrics
from service.adapters.redis.stores import RedisStores
from service.domain.errors import ProductNotFound
from service.domain.stock.buckets import bucket_of
from service.domain.stock.realign import Realigner
from service.domain.stock.realign_report import RealignReport
from service.failures import StoreFailure

_SWITCH_RETRIED = metrics.retry_counter("set_stock_mode")

log = structlog.get_logger(__name__)

DRAIN_SECONDS = 30.0
"""How long a switch to ``database`` waits for Redis reservations in flight to land."""
_POLL_SECONDS = 0.05
_OPEN_ATTEMPTS = 5


async def set_mode(engine: AsyncEngine, product_id: int, mode: StockMode) -> None:
    """``products.stock_mode = mode``, written with the product row and then its inventory row
    locked (the lock order of :data:`db.queries.products.LOCKED`), so purchases see the switch
    in commit order.

    Raises:
        ProductNotFound: no product or inventory row.
    """

    async def write(conn: AsyncConnection) -> None:
        if (await conn.execute(products.LOCKED, {"id": product_id})).first() is None:
            raise ProductNotFound(product_id)
        if (await conn.execute(inventory.STOCK_LOCKED, {"p": product_id})).first() is None:
            raise ProductNotFound(product_id)
        await conn.execute(products.SET_MODE, {"id": product_id, "mode": mode.value})

    await in_transaction(engine, write, label="set_stock_mode", on_retry=_SWITCH_RETRIED)


async def switch_to_database(
    engine: AsyncEngine, store: RedisStores, realigner: Realigner, product_id: int, drain_seconds: float = DRAIN_SECONDS
) -> int:
    """Move ``product_id`` from ``redis`` to ``database`` mode (see the module docstring).
    Returns the reservations still in flight when MySQL started serving (0 when all landed;
    -1 when Redis could not be reached).

    Raises:
        ProductNotFound: no such product.
    """
    in_flight = -1
    try:
        await store.stock.mark_moved(product_id, buckets=await realigner.bucket_count(product_id))
        deadline = asyncio.get_running_loop().time() + drain_seconds
        while (in_flight := (await realigner.realign(product_id)).in_flight) > 0:
            if asyncio.get_running_loop().time() > deadline:
                log.warning("stock_mode_drain_timeout", product_id=product_id, in_flight=in_flight)
                break
            await asyncio.sleep(_POLL_SECONDS)
    except StoreFailure as exc:
        if exc.store != "redis":
            raise
        log.warning("stock_mode_switch_without_redis", product_id=product_id, error=repr(exc))
    await set_mode(engine, product_id, StockMode.DATABASE)
    log.info("stock_mode_switched", product_id=product_id, mode="database", in_flight=in_flight)
    return in_flight


async def switch_to_redis(
    engine: AsyncEngine, store: RedisStores, realigner: Realigner, product_id: int
) -> RealignReport:
    """Move ``product_id`` from ``database`` to ``redis`` mode (see the module docstring); returns
    the realignment pass that loaded Redis and opened it.

    Raises:
        ProductNotFound: no such product.
        service.failures.StoreUnavailable: Redis failed (MySQL says ``redis``; purchases answer ``503``
            until a pass succeeds: run the switch again).
    """
    await set_mode(engine, product_id, StockMode.REDIS)
    buckets = await realigner.bucket_count(product_id)
    async with engine.connect() as conn:
        window = {"p": product_id, "s": store.replays.ttl_seconds}
        recent = (await conn.execute(orders.REPLAYABLE, window)).all()
    by_bucket: dict[int, list[tuple[str, str, int]]] = defaultdict(list)
    for r in recent:
        by_bucket[bucket_of(r.user_id, buckets)].append((r.request_id, r.order_no, r.quantity))
    for bucket, seeds in by_bucket.items():
        await store.replays.seed(product_id, seeds, bucket=bucket)
    for _ in range(_OPEN_ATTEMPTS):
        report = await realigner.realign(product_id, open_sale=True)
        if not report.skipped_stale:
            break
        # A pass with a newer snapshot wrote first; the next pass has a newer one still.
    log.info("stock_mode_switched", product_id=product_id, mode="redis")
    return report
