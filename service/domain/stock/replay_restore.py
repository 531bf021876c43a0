"""Replay records given back to a product whose Redis buckets were lost, rolled back or never
loaded, before realignment loads their stock again (docs/ARCHITECTURE.md, "Self-healing"): a
buyer who retries with the same Idempotency-Key is then answered the order they have, not a
second one (lua/restore_replays.lua).
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict

import structlog
from sqlalchemy.ext.asyncio import AsyncEngine

from db.queries import orders
from service.adapters.broker import Publisher
from service.adapters.redis.stores import RedisStores
from service.domain.stock.buckets import bucket_of
from service.failures import StoreFailure

log = structlog.get_logger(__name__)

QUEUED_WAIT_SECONDS = 15.0
"""How long a pass that reloads a lost bucket waits for the orders queued at the loss to be written."""
CONSUMER_SETTLE_SECONDS = 0.5
"""Once no order message is ready: time for the batches consumers hold to commit."""


class ReplayRestorer:
    """Gives back the replay records of lost buckets; ``publisher`` may be None (then the orders
    still queued at the loss are not waited for)."""

    def __init__(self, engine: AsyncEngine, store: RedisStores, publisher: Publisher | None) -> None:
        self._engine = engine
        self._store = store
        self._publisher = publisher

    async def restore(self, product_id: int, buckets: int, lost: set[int], *, after_sales: bool) -> None:
        """Redis does not hold the product's buckets ``lost`` (lost, rolled back, or never
        loaded): give back the replay records of their buyers' orders still in the replay
        window, read fresh from MySQL just before the stock is loaded (until then reserves answer
        ``not loaded``), so a buyer who retries with the same Idempotency-Key is answered the
        order they have, not a second one. When the product ``after_sales`` had sold, the orders
        still queued at the loss are written first (:meth:`_queued_orders_written`), so their
        records are given back too."""
        if after_sales:
            await self._queued_orders_written()
        async with self._engine.connect() as conn:
            found = await conn.execute(orders.REPLAYABLE, {"p": product_id, "s": self._store.replays.ttl_seconds})
            by_bucket: dict[int, list[tuple[str, str, int, int]]] = defaultdict(list)
            for row in found:
                by_bucket[bucket_of(row.user_id, buckets)].append(
                    (row.request_id, row.order_no, row.quantity, int(row.age))
                )
        for bucket in sorted(lost & by_bucket.keys()):
            restored = await self._store.replays.restore(product_id, by_bucket[bucket], bucket=bucket)
            if restored:
                log.warning("replay_records_restored", product_id=product_id, bucket=bucket, restored=restored)

    async def _queued_orders_written(self) -> None:
        """Wait, at most :data:`QUEUED_WAIT_SECONDS`, until the broker holds no order message
        ready (order and retry queues), then :data:`CONSUMER_SETTLE_SECONDS` for the batches
        consumers hold to commit: the orders accepted before Redis lost its data have their rows
        by then. Without a publisher, or when the broker cannot be asked, no wait (a retry of such
        an order may then be answered a second order number: recorded ``rejected``)."""
        if self._publisher is None:
            return
        deadline = time.monotonic() + QUEUED_WAIT_SECONDS
        while time.monotonic() < deadline:
            try:
                waiting = await self._publisher.orders_waiting()
            except StoreFailure as exc:
                log.warning("queued_orders_unknown", error=repr(exc))
                return
            if waiting == 0:
                await asyncio.sleep(CONSUMER_SETTLE_SECONDS)
                return
            await asyncio.sleep(0.1)
        log.warning("queued_orders_still_waiting", seconds=QUEUED_WAIT_SECONDS)
