"""``flashsale consume``: take order messages from RabbitMQ and write them to MySQL in batches.

Every delivery runs in its own task (aio-pika's): it is decoded, then waits in the batch being
gathered. One writer task per consumer takes up to ``batch_size`` waiting orders (whatever
arrived, lingering ``linger_seconds`` for more while fewer wait) and hands them to
:class:`service.domain.order_writer.OrderWriter`: one Redis claim round trip, one MySQL
transaction. After the commit the outcomes become acks in one place
(:meth:`OrderConsumer._settle`): the batch is acked (one ``multiple`` ack where the window
allows); what may succeed later is requeued with backoff by its delivery's own task (and
dead-lettered by the queue past the delivery limit). A poison message never holds up the rest
of its batch: an undecodable one is dead-lettered before it joins a batch, an unknown product or
a taken order number gets its own outcome while the others commit. A failed batch (database
down, retries exhausted) is requeued with backoff, delivery by delivery.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

import structlog
from aio_pika.abc import AbstractIncomingMessage
from sqlalchemy.ext.asyncio import AsyncEngine

from consumers import observe
from service.adapters.broker import OrderMessage, connect_when_up, declare_topology
from service.adapters.redis.stock_store import StockStore
from service.bootstrap import Resources
from service.domain.order_writer import InvalidOrder, OrderWriter, Outcome, parse_order
from service.runtime import stop_signal
from service.settings import AMQPSettings

log = structlog.get_logger(__name__)

RETRY_BACKOFF_SECONDS = 1.0  # unit of the requeue backoff
BATCH_LINGER_SECONDS = 0.005  # how long a short batch waits for more deliveries


@dataclass(slots=True)
class _Delivery:
    """One decoded delivery waiting for (or in) a batch. ``acked`` resolves after the batch's
    commit: True once the writer acked it, False when its own task is to requeue it."""

    message: AbstractIncomingMessage
    order: OrderMessage
    acked: asyncio.Future[bool]


class OrderConsumer:
    """Handles the deliveries of one channel in batches, one batch transaction at a time;
    tracks the ones in hand for a clean shutdown. ``batch_size``: orders in one transaction at
    most (a batch never holds more than the prefetch window)."""

    def __init__(
        self,
        engine: AsyncEngine,
        store: StockStore,
        replay_window_seconds: int = 86_400,
        *,
        batch_size: int = 100,
        linger_seconds: float = BATCH_LINGER_SECONDS,
    ) -> None:
        self._writer = OrderWriter(engine, store, replay_window_seconds)
        self._batch_size = batch_size
        self._linger = linger_seconds
        self._waiting: list[_Delivery] = []
        self._batch_full = asyncio.Event()
        self._writing: asyncio.Task[None] | None = None
        self._in_hand: set[asyncio.Task[None]] = set()
        self._unsettled: set[AbstractIncomingMessage] = set()  # not yet acked, nacked nor rejected
        self._frames = asyncio.Lock()  # one settling frame (batch) at a time: see _ack
        self._stopping = asyncio.Event()
        self.counts: dict[str, int] = {}

    @property
    def in_hand(self) -> int:
        """Deliveries being processed right now."""
        return len(self._in_hand)

    def _count(self, what: str) -> None:
        self.counts[what] = self.counts.get(what, 0) + 1
        observe.count(what)

    async def handle(self, message: AbstractIncomingMessage) -> None:
        """Process one delivery: returns once it is settled (acked after its batch committed,
        requeued, or dead-lettered)."""
        task = asyncio.current_task()
        assert task is not None
        self._in_hand.add(task)
        self._unsettled.add(message)
        try:
            await self._handle(message)
        except Exception as exc:  # never leave a delivery unsettled: it would stall the prefetch window
            log.exception("handler_failed", message_id=message.message_id, error=repr(exc))
            if message in self._unsettled:
                await self._retry_later(message)
        finally:
            self._in_hand.discard(task)
            self._unsettled.discard(message)

    async def _handle(self, message: AbstractIncomingMessage) -> None:
        try:
            order = parse_order(message.body)
        except InvalidOrder as exc:
            log.error("dead_lettered_invalid", message_id=message.message_id, error=str(exc))
            self._count("invalid")
            async with self._frames:
                self._unsettled.discard(message)
                await message.reject(requeue=False)
            return
        delivery = _Delivery(message, order, asyncio.get_running_loop().create_future())
        self._enqueue(delivery)
        try:
            acked = await delivery.acked
        except Exception as exc:
            log.error("apply_failed", request_id=order.request_id, error=repr(exc))
            self._count("failed")
            acked = message not in self._unsettled  # an ack was sent before the failure
        if not acked:
            await self._retry_later(message)

    def _enqueue(self, delivery: _Delivery) -> None:
        """Put ``delivery`` in the next batch; start the writer if it is not running."""
        self._waiting.append(delivery)
        if len(self._waiting) >= self._batch_size:
            self._batch_full.set()
        if self._writing is None or self._writing.done():
            self._writing = asyncio.create_task(self._write_batches())

    async def _write_batches(self) -> None:
        """Write what waits, one batch at a time, until nothing waits. A short batch lingers
        (not while stopping) so deliveries arriving together share a transaction; deliveries
        arriving while a batch is written wait for the next one."""
        while self._waiting:
            if len(self._waiting) < self._batch_size and not self._stopping.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._batch_full.wait(), self._linger)
            batch, self._waiting = self._waiting[: self._batch_size], self._waiting[self._batch_size :]
            if len(self._waiting) < self._batch_size:
                self._batch_full.clear()
            try:
                orders = [delivery.order for delivery in batch]
                outcomes = await self._writer.write(orders)
                observe.written(orders, outcomes)
                await self._settle(batch, outcomes)
            except Exception as exc:  # every delivery not yet acked is requeued by its own task
                for delivery in batch:
                    if not delivery.acked.done():
                        delivery.acked.set_exception(exc)

    async def _settle(self, batch: list[_Delivery], outcomes: list[Outcome]) -> None:
        """The one place where a written batch's outcomes become acks (after the commit): applied,
        rejected, duplicate and released orders are acked; an unknown product or a taken order
        number wrote nothing and is requeued with backoff by its own task (dead-lettered past
        the delivery limit), so it never holds up the rest of the batch."""
        to_ack: list[_Delivery] = []
        log.info(
            "orders_written",
            orders=[
                {
                    "request_id": delivery.order.request_id,
                    "order_no": delivery.order.order_no,
                    "outcome": outcome.value,
                    "http_request_id": delivery.message.correlation_id,
                }
                for delivery, outcome in zip(batch, outcomes, strict=True)
            ],
        )
        for delivery, outcome in zip(batch, outcomes, strict=True):
            self._count(outcome.value)
            if outcome in (Outcome.UNKNOWN_PRODUCT, Outcome.CONFLICT):
                order = delivery.order
                log.error(
                    outcome.value, request_id=order.request_id, product_id=order.product_id, order_no=order.order_no
                )
                delivery.acked.set_result(False)
            else:
                to_ack.append(delivery)
        await self._ack([delivery.message for delivery in to_ack])
        for delivery in to_ack:
            delivery.acked.set_result(True)

    async def _ack(self, messages: list[AbstractIncomingMessage]) -> None:
        """Ack ``messages``. Those below every other unsettled delivery of the channel are acked
        with one ``multiple`` ack of the latest of them (one frame, where one ack per message
        costs the broker more than the write); the rest (above a delivery waiting to be
        requeued) one by one. Settling frames go out one call at a time (``_frames``), so a
        ``multiple`` ack never covers a delivery another task is about to nack (the broker
        would close the channel)."""
        async with self._frames:
            self._unsettled.difference_update(messages)
            if len(messages) == 1:
                await messages[0].ack()
                return
            floor = min((message.delivery_tag or 0 for message in self._unsettled), default=None)
            below = [m for m in messages if floor is None or (m.delivery_tag or 0) < floor]
            if below:
                await max(below, key=lambda message: message.delivery_tag or 0).ack(multiple=True)
            for message in messages:
                if floor is not None and (message.delivery_tag or 0) > floor:
                    await message.ack()

    async def _retry_later(self, message: AbstractIncomingMessage) -> None:
        """Requeue after a backoff that grows with the delivery count (1, 2, 4 ... 30 s), so a
        short MySQL outage does not burn the delivery limit; past the limit the quorum queue
        dead-letters the message (and realignment re-publishes its reservation after the grace).
        A shutdown cuts the wait short."""
        count = (message.headers or {}).get("x-delivery-count")
        deliveries = count if isinstance(count, int) else 0
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), min(2.0**deliveries, 30.0) * RETRY_BACKOFF_SECONDS)
        async with self._frames:
            self._unsettled.discard(message)
            await message.nack(requeue=True)

    async def drain(self) -> None:
        """Wait for every delivery in hand to finish (used on SIGTERM): the batches in hand are
        written, committed and acked; backoffs end at once."""
        self._stopping.set()
        while self._in_hand:
            await asyncio.gather(*list(self._in_hand), return_exceptions=True)


@contextlib.asynccontextmanager
async def consuming(amqp: AMQPSettings, consumer: OrderConsumer, prefetch: int) -> AsyncIterator[None]:
    """``consumer`` takes deliveries from the order queue (topology declared, at most ``prefetch``
    in hand) on a robust connection of its own while the block runs; on exit it stops taking
    them, finishes and acks those in hand, and closes the connection. A broker that is away at
    start is waited for (:func:`service.adapters.broker.connect_when_up`)."""
    connection = await connect_when_up(amqp.url, "consumer")
    try:
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=prefetch)
        _, queue = await declare_topology(channel, amqp)
        tag = await queue.consume(consumer.handle)
        try:
            yield
        finally:
            await queue.cancel(tag)
            await consumer.drain()
    finally:
        await connection.close()


async def run_consumer(resources: Resources, prefetch: int, metrics_port: int | None = None) -> None:
    """Consume until SIGTERM/SIGINT, then stop taking messages, finish those in hand, and return.
    ``prefetch``: deliveries in hand at most; batches of ``FLASHSALE_AMQP__BATCH_SIZE`` at most.
    ``metrics_port``: where ``/metrics`` is served (None or 0: not served; queue depths are
    sampled all the same)."""
    settings = resources.settings
    consumer = OrderConsumer(
        resources.engine, resources.store, settings.orders.replay_ttl_seconds, batch_size=settings.amqp.batch_size
    )
    try:
        with stop_signal() as stop:
            async with (
                observe.exposed(settings, metrics_port),
                consuming(settings.amqp, consumer, prefetch),
            ):
                log.info("consuming", queue=settings.amqp.queue, prefetch=prefetch, batch_size=settings.amqp.batch_size)
                await stop.wait()
                log.info("stopping", in_hand=consumer.in_hand)
    finally:
        log.info("stopped", **consumer.counts)
