"""Publishing overdue reservations again: a journal entry older than the grace period with no
order row was accepted but its message never reached MySQL (e.g. the API died between reserve
and publish). Safe to repeat: the consumer's ``UNIQUE(request_id)`` makes a second copy a no-op
(docs/ARCHITECTURE.md, "Realignment")."""

from __future__ import annotations

import asyncio
from collections.abc import Collection

import structlog

from service.adapters.broker import Publisher
from service.adapters.redis.stores import RedisStores
from service.failures import PublishFailed
from service.model.order_message import OrderMessage
from service.model.stock import JournalEntry

log = structlog.get_logger(__name__)

LONGEST_BACKOFF_SECONDS = 300.0
"""An overdue reservation is published again after the grace period, then after twice that,
four times, ... but at least every five minutes (once per back-off, not per pass)."""


class Republisher:
    """Publishes a product's overdue reservations again, each once per back-off period, priced
    at the unit price fixed when it was reserved. ``grace_ms``: how old an entry must be."""

    def __init__(self, store: RedisStores, publisher: Publisher, grace_ms: int) -> None:
        self._store = store
        self._publisher = publisher
        self._grace_ms = grace_ms

    async def overdue(
        self,
        product_id: int,
        price: int,
        journal: list[JournalEntry],
        resolved: Collection[str],
        bucket: int,
        cutoff_ms: int,
    ) -> int:
        """Publish again the bucket's reservations older than ``cutoff_ms`` that MySQL has no
        row of, each once per back-off period (``republish_due.lua``). Returns how many."""
        overdue = [e.request_id for e in journal if e.request_id not in resolved and e.reserved_at_ms < cutoff_ms]
        due = set(
            await self._store.stock.republish_due(
                product_id, overdue, self._grace_ms / 1000, LONGEST_BACKOFF_SECONDS, bucket=bucket
            )
        )
        return await self._publish(product_id, price, [e for e in journal if e.request_id in due], bucket)

    async def _publish(self, product_id: int, price: int, stale: list[JournalEntry], bucket: int) -> int:
        """Publish overdue reservations again, side by side (so they leave in groups, as the API's
        orders do: :mod:`service.adapters.publish_groups`), each priced at the unit price fixed
        when it was reserved. ``price`` (the product's price now, minor units) only prices
        entries written before the journal recorded the unit price (left in a live journal by
        an upgrade): for those nothing better is known, as before."""
        messages = [
            OrderMessage(
                entry.request_id,
                entry.order_no,
                entry.user_id,
                product_id,
                entry.quantity,
                entry.reserved_at_ms,
                (price if entry.unit_price is None else entry.unit_price) * entry.quantity,
                bucket,
            )
            for entry in stale
        ]
        outcomes = await asyncio.gather(
            *(self._publisher.publish(message) for message in messages), return_exceptions=True
        )
        published: list[dict[str, str]] = []
        for message, outcome in zip(messages, outcomes, strict=True):
            if isinstance(outcome, PublishFailed):
                log.warning("republish_failed", request_id=message.request_id, order_no=message.order_no)
                continue
            if isinstance(outcome, BaseException):
                raise outcome
            published.append({"request_id": message.request_id, "order_no": message.order_no})
            await self._store.replays.mark_queued_if_pending(product_id, message.request_id, bucket=bucket)
        if published:
            log.warning("republished_stale_reservations", product_id=product_id, count=len(published), orders=published)
        return len(published)
