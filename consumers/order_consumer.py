"""``flashsale consume``: take order messages from RabbitMQ and hand each to the order writer.

Acks follow the writer's outcome in one place (``OrderConsumer._handle``): ack after commit,
requeue with backoff on a transient failure, dead-letter what can never be applied.
"""

from __future__ import annotations

import asyncio
import contextlib

import aio_pika
import structlog
from aio_pika.abc import AbstractIncomingMessage
from redis.exceptions import RedisError
from sqlalchemy.ext.asyncio import AsyncEngine

from service.adapters.broker import OrderMessage, declare_topology
from service.adapters.redis.results import ClaimOutcome
from service.adapters.redis.stock_store import StockStore
from service.bootstrap import Resources
from service.domain.order_writer import InvalidOrder, Outcome, apply_order, parse_order
from service.runtime import stop_signal

log = structlog.get_logger(__name__)

RETRY_BACKOFF_SECONDS = 1.0  # unit of the requeue backoff


class OrderConsumer:
    """Handles deliveries from the order queue; tracks the ones in hand for a clean shutdown."""

    def __init__(self, engine: AsyncEngine, store: StockStore, replay_window_seconds: int = 86_400) -> None:
        self._engine = engine
        self._replay_window = replay_window_seconds
        self._store = store
        self._in_hand: set[asyncio.Task[None]] = set()
        self._stopping = asyncio.Event()
        self.counts: dict[str, int] = {}

    @property
    def in_hand(self) -> int:
        """Deliveries being processed right now."""
        return len(self._in_hand)

    def _count(self, what: str) -> None:
        self.counts[what] = self.counts.get(what, 0) + 1

    async def _claim(self, order: OrderMessage) -> ClaimOutcome:
        try:
            return await self._store.claim(order.product_id, order.request_id)
        except RedisError as exc:
            # Without Redis, MySQL's unique request id still decides: never drop an order for it.
            log.warning("claim_failed", request_id=order.request_id, error=repr(exc))
            return ClaimOutcome.UNKNOWN

    async def handle(self, message: AbstractIncomingMessage) -> None:
        """Process one delivery; ack after commit, dead-letter what can never be applied."""
        task = asyncio.current_task()
        assert task is not None
        self._in_hand.add(task)
        try:
            await self._handle(message)
        except Exception as exc:  # never leave a delivery unsettled: it would stall the prefetch window
            log.exception("handler_failed", message_id=message.message_id, error=repr(exc))
            if not message.processed:
                await self._retry_later(message)
        finally:
            self._in_hand.discard(task)

    async def _handle(self, message: AbstractIncomingMessage) -> None:
        try:
            order = parse_order(message.body)
        except InvalidOrder as exc:
            log.error("dead_lettered_invalid", message_id=message.message_id, error=str(exc))
            self._count("invalid")
            await message.reject(requeue=False)
            return
        if await self._claim(order) is ClaimOutcome.RELEASED:
            # The API gave this reservation back (publish failed) and told the buyer 503.
            self._count("released")
            await message.ack()
            return
        try:
            outcome = await apply_order(self._engine, order, self._replay_window)
        except Exception as exc:
            log.error("apply_failed", request_id=order.request_id, error=repr(exc))
            self._count("failed")
            await self._retry_later(message)
            return
        if outcome is Outcome.UNKNOWN_PRODUCT:
            log.error("unknown_product", request_id=order.request_id, product_id=order.product_id)
            self._count(outcome.value)
            await self._retry_later(message)
            return
        self._count(outcome.value)
        await message.ack()

    async def _retry_later(self, message: AbstractIncomingMessage) -> None:
        """Requeue after a backoff that grows with the delivery count (1, 2, 4 ... 30 s), so a
        short MySQL outage does not burn the delivery limit; past the limit the quorum queue
        dead-letters the message (and realignment re-publishes its reservation after the grace).
        A shutdown cuts the wait short."""
        deliveries = int((message.headers or {}).get("x-delivery-count", 0) or 0)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), min(2.0**deliveries, 30.0) * RETRY_BACKOFF_SECONDS)
        await message.nack(requeue=True)

    async def drain(self) -> None:
        """Wait for every delivery in hand to finish (used on SIGTERM); backoffs end at once."""
        self._stopping.set()
        while self._in_hand:
            await asyncio.gather(*list(self._in_hand), return_exceptions=True)


async def run_consumer(resources: Resources, prefetch: int) -> None:
    """Consume until SIGTERM/SIGINT, then stop taking messages, finish those in hand, and return.
    ``prefetch``: deliveries in hand at most."""
    settings = resources.settings
    consumer = OrderConsumer(resources.engine, resources.store, settings.orders.replay_ttl_seconds)
    with stop_signal() as stop:
        connection = await aio_pika.connect_robust(settings.amqp.url)
        try:
            channel = await connection.channel()
            await channel.set_qos(prefetch_count=prefetch)
            _, queue = await declare_topology(channel, settings.amqp)
            tag = await queue.consume(consumer.handle)
            log.info("consuming", queue=settings.amqp.queue, prefetch=prefetch)
            await stop.wait()
            log.info("stopping", in_hand=consumer.in_hand)
            await queue.cancel(tag)
            await consumer.drain()
        finally:
            await connection.close()
            log.info("stopped", **consumer.counts)
