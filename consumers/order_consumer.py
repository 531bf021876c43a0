"""Take order messages from RabbitMQ and write them to MySQL in batches.

Deliveries come through :class:`service.adapters.subscription.Subscription` (aiormq's layer,
without aio-pika's message objects); each is decoded as it arrives and waits in the batch being
gathered; a delivery carries one order or a group of them (docs/ARCHITECTURE.md, "Order
messages and groups"), and a group is never split between batches. A writer task of the consumer
takes waiting deliveries until it holds ``batch_size`` orders (whatever arrived, lingering for
more while fewer wait and they keep coming, ``linger_seconds`` at most; the last group taken may
go beyond it) and hands their orders to
:class:`service.domain.fulfilment.order_writer.OrderWriter`: one Redis claim round trip, one
MySQL transaction; while full batches wait, up to ``writers`` such tasks write at once. Each
order then gets one :class:`Settlement`, and :meth:`OrderConsumer._settle` is the one place where
settlements become broker actions, delivery by delivery (:mod:`consumers.settlements`: an order
of a group is dead-lettered alone, the orders retried go to the retry queue together):

- ``ACK``: written (applied or rejected), a duplicate, or released by the API: acked (one
  ``multiple`` ack where the window allows).
- ``RETRY``: a transient failure (:func:`service.failures.is_transient`: MySQL unreachable or
  failing over, deadlocks or lock waits past the transaction's own retries): a copy goes to the
  retry queue of its turn (1, 2, 5, 10, 30 s by default, ``FLASHSALE_AMQP__RETRY_DELAYS``) and the
  delivery is acked, so nothing waits out a back-off in the prefetch window and an outage never
  spends the order queue's delivery limit (kept for a message that kills the consumer). The copy
  comes back to the order queue by itself (:mod:`service.adapters.broker_topology`). A failure that is not
  known to be transient and persists for one order alone is retried :data:`MAX_FAILED_WRITES` times,
  then dead-lettered.
- ``DEAD``: a permanent failure (undecodable or out-of-domain body, unknown product, an order
  number that cannot be written at all): dead-lettered at once with a reason header
  (:mod:`service.adapters.retry_routing`), without holding up the rest of its batch.

A failed batch whose error is not known to be transient is written again order by order, so one
poison order (of a group too) cannot fail the others. If a copy cannot be published (the broker is failing too),
the delivery is requeued (nack) instead: then, and only then, the delivery limit counts.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict
from collections.abc import Coroutine
from typing import Any

import structlog
from aio_pika.exceptions import CONNECTION_EXCEPTIONS
from aiormq.abc import AbstractChannel as AbstractAMQPChannel
from sqlalchemy.ext.asyncio import AsyncEngine

from consumers import worker_metrics
from consumers.settlements import (
    ACK,
    Action,
    Carried,
    Copy,
    Settled,
    Settlement,
    Waiting,
    by_delivery,
    copies_of,
    fallback,
)
from service.adapters.redis.stores import RedisStores
from service.adapters.retry_routing import RetryRouter, times_retried
from service.adapters.subscription import Delivery
from service.domain.fulfilment.incoming import InvalidOrder, parse_body
from service.domain.fulfilment.order_writer import OrderWriter, Outcome
from service.failures import is_transient
from service.pace import Pace

log = structlog.get_logger(__name__)

BATCH_LINGER_SECONDS = 0.020
"""The most a short batch waits for more deliveries (:class:`service.pace.Pace`: nothing while
they come further apart than that)."""
FALLBACK_SECONDS = 1.0
"""How long a delivery whose retry or dead-letter copy could not be published waits before it
is requeued (the broker is failing: no hot loop of redeliveries)."""
MAX_FAILED_WRITES = 5
"""Retries of one order that fails alone with an error not known to be transient (a bug, a
schema the code does not expect) before it is dead-lettered (``write_failed``)."""


_DEAD_OUTCOMES = {Outcome.UNKNOWN_PRODUCT: "unknown_product", Outcome.CONFLICT: "order_no_conflict"}


class OrderConsumer:
    """Handles the deliveries of one channel in batches; tracks the ones not yet settled for a
    clean shutdown. ``batch_size``: orders in one transaction at most (a batch never holds more
    than the prefetch window); ``writers``: batch transactions at once at most, more than one only
    while full batches wait (:meth:`_write_batches`). Without a
    :class:`RetryRouter` (:meth:`route_with`; :func:`consumers.consume.consuming` gives it one) a retry is a
    requeue and a dead letter a reject."""

    def __init__(
        self,
        engine: AsyncEngine,
        store: RedisStores,
        replay_window_seconds: int = 86_400,
        *,
        batch_size: int = 100,
        linger_seconds: float = BATCH_LINGER_SECONDS,
        writers: int = 1,
    ) -> None:
        self._writer = OrderWriter(engine, store, replay_window_seconds)
        self._batch_size = batch_size
        self._pace = Pace(linger_seconds, batch_size)
        self._max_writers = writers
        self._router: RetryRouter | None = None
        self._waiting: list[list[Waiting]] = []  # per delivery, the orders it carries
        self._waiting_orders = 0
        self._batch_full = asyncio.Event()
        self._writers: set[asyncio.Task[None]] = set()  # batch transactions being written
        self._alone: set[asyncio.Task[None]] = set()  # settling one delivery outside a batch
        self._unsettled: set[Delivery] = set()  # taken, not yet acked, nacked nor rejected
        self._frames = asyncio.Lock()  # one settling frame (batch) at a time: see _ack
        self._stopping = asyncio.Event()
        self.counts: dict[str, int] = {}

    def route_with(self, router: RetryRouter | None) -> None:
        """Send retries and dead letters through ``router`` from now on."""
        self._router = router

    @property
    def in_hand(self) -> int:
        """Deliveries taken and not yet settled."""
        return len(self._unsettled)

    def _count(self, what: str) -> None:
        self.counts[what] = self.counts.get(what, 0) + 1
        worker_metrics.count(what)

    def handle(self, message: Delivery) -> None:
        """Take one delivery (the subscription's callback; returns at once): its orders wait in
        the next batch and it is acked after that batch committed, or sent to a retry queue, or
        dead-lettered (a body that is not an order nor a group: at once)."""
        self._unsettled.add(message)
        try:
            incoming = parse_body(message.body)
        except Exception as exc:  # never leave a delivery unsettled: it would stall the prefetch window
            if isinstance(exc, InvalidOrder):
                self._count("invalid")
                settlement = Settlement(Action.DEAD, "invalid_order", str(exc))
            else:
                log.exception("handler_failed", message_id=message.message_id, error=repr(exc))
                settlement = self._failed(message, exc)
            self._aside(self._settle_alone(message, settlement))
            return
        group = incoming.group
        orders: list[Waiting] = []
        for index, (order, invalid) in enumerate(zip(incoming.orders, incoming.invalid, strict=True)):
            http_request_id = message.correlation_id if group is None else group.http_request_id(index)
            if invalid is not None:
                self._count("invalid")
            orders.append(Waiting(message, order, http_request_id, group, invalid))
        self._waiting.append(orders)
        self._waiting_orders += len(orders)
        self._pace.arrived(asyncio.get_running_loop().time(), len(orders))
        if self._waiting_orders >= self._batch_size:
            self._batch_full.set()
        if not self._writers or (self._batch_full.is_set() and len(self._writers) < self._max_writers):
            self._writers.add(asyncio.create_task(self._write_batches()))

    def _aside(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` (settling one delivery outside a batch) in a task :meth:`drain` waits for."""
        task = asyncio.create_task(work)
        self._alone.add(task)
        task.add_done_callback(self._alone.discard)

    async def _settle_alone(self, message: Delivery, settlement: Settlement) -> None:
        try:
            left = await self._settle({message: (None, [Carried(None, message.correlation_id, settlement)])})
        except Exception as exc:  # a bug in settling: back to the queue, later
            log.exception("settle_failed", message_id=message.message_id, error=repr(exc))
            left = {message: settlement}
        if left:
            await self._requeue_later(message, settlement)

    async def _write_batches(self) -> None:
        """Write what waits, one batch at a time, until nothing waits. A short batch lingers
        (not while stopping) so deliveries arriving together share a transaction, as long as
        their pace makes worthwhile (:class:`service.pace.Pace`: not at all while they come
        further apart than ``linger_seconds``, never longer than that); deliveries arriving
        while a batch is written wait for the next one. A batch takes whole
        deliveries until it holds ``batch_size`` orders (so it may hold up to one group more).

        Up to ``writers`` of these run at once, each its own transaction, but only while full
        batches wait (a backlog: the transactions' round trips overlap, as the raw writer's
        connections do); a writer beside another leaves a short batch to the one still writing,
        so a steady trickle keeps one writer and its batches as large as arrivals make them."""
        try:
            await self._write_while_waiting()
        finally:  # at once, not in a done callback: handle() must never count a writer that left
            self._writers.discard(asyncio.current_task())

    async def _write_while_waiting(self) -> None:
        while self._waiting:
            if self._waiting_orders < self._batch_size and not self._stopping.is_set():
                if len(self._writers) > 1:
                    return
                if linger := self._pace.linger():
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._batch_full.wait(), linger)
                if not self._waiting:
                    return  # another writer took it meanwhile
            taken = count = 0
            for orders in self._waiting:
                if taken >= self._batch_size:
                    break
                taken, count = taken + len(orders), count + 1
            deliveries, self._waiting = self._waiting[:count], self._waiting[count:]
            self._waiting_orders -= taken
            if self._waiting_orders < self._batch_size:
                self._batch_full.clear()
            batch = [waiting for orders in deliveries for waiting in orders]
            try:
                left = await self._settle(by_delivery(batch, await self._write(batch)))
            except Exception as exc:  # a bug in writing or settling: back to the queue, later
                log.exception("batch_settle_failed", orders=len(batch), error=repr(exc))
                failed = Settlement(Action.RETRY, "failed", repr(exc))
                left = {orders[0].message: failed for orders in deliveries if orders[0].message in self._unsettled}
            for message, settlement in left.items():
                self._aside(self._requeue_later(message, settlement))

    async def _write(self, batch: list[Waiting]) -> list[Settlement]:
        """One settlement per order of ``batch``: an order out of its domain (in a group) is
        dead-lettered unwritten, the others are written (:meth:`_write_orders`)."""
        settlements = [
            None if waiting.invalid is None else Settlement(Action.DEAD, "invalid_order", str(waiting.invalid))
            for waiting in batch
        ]
        writable = [waiting for waiting in batch if waiting.invalid is None]
        written = iter(await self._write_orders(writable) if writable else [])
        return [next(written) if settlement is None else settlement for settlement in settlements]

    async def _write_orders(self, batch: list[Waiting]) -> list[Settlement]:
        """One settlement per order of ``batch``: the batch written in one transaction; when that
        fails with an error not known to be transient, order by order."""
        orders = [waiting.good for waiting in batch]
        try:
            outcomes = await self._writer.write(orders)
        except Exception as exc:
            if is_transient(exc) or len(batch) == 1:
                log.warning("batch_failed", orders=len(batch), transient=is_transient(exc), error=repr(exc))
                for _ in batch:
                    self._count("failed")
                return [self._failed(waiting.message, exc) for waiting in batch]
            log.warning("batch_failed_writing_one_by_one", orders=len(batch), error=repr(exc))
            return [settlement for waiting in batch for settlement in await self._write_orders([waiting])]
        worker_metrics.written(orders, outcomes)
        log.info(
            "orders_written",
            orders=[
                {
                    "request_id": waiting.good.request_id,
                    "order_no": waiting.good.order_no,
                    "outcome": outcome.value,
                    "http_request_id": waiting.http_request_id,
                }
                for waiting, outcome in zip(batch, outcomes, strict=True)
            ],
        )
        settlements = []
        for waiting, outcome in zip(batch, outcomes, strict=True):
            self._count(outcome.value)
            if outcome in _DEAD_OUTCOMES:
                order = waiting.good
                log.error(
                    outcome.value, request_id=order.request_id, product_id=order.product_id, order_no=order.order_no
                )
                settlements.append(
                    Settlement(Action.DEAD, _DEAD_OUTCOMES[outcome], f"{outcome.value}: nothing written")
                )
            else:
                settlements.append(ACK)
        return settlements

    def _failed(self, message: Delivery, exc: BaseException) -> Settlement:
        """The settlement for ``message`` after ``exc``: retried, or dead-lettered when the error is
        not known to be transient and it has been retried :data:`MAX_FAILED_WRITES` times."""
        if not is_transient(exc) and times_retried(message) >= MAX_FAILED_WRITES:
            return Settlement(Action.DEAD, "write_failed", repr(exc))
        return Settlement(Action.RETRY, "transient" if is_transient(exc) else "failed", repr(exc))

    async def _settle(self, settled: dict[Delivery, Settled]) -> dict[Delivery, Settlement]:
        """The one place where settlements become broker actions. The retry and dead-letter
        copies of every delivery (:func:`consumers.settlements.copies_of`) are published
        (confirmed, side by side), then every delivery whose copies all went is acked together
        with the written ones. Returns the deliveries a copy of which could not be published
        (the broker is failing too, or no router), each with one settlement
        (:func:`consumers.settlements.fallback`): still unsettled, for their own tasks to
        requeue whole (:meth:`_requeue_later`)."""
        copies = [
            (message, copy) for message, (group, carried) in settled.items() for copy in copies_of(group, carried)
        ]
        sent = await asyncio.gather(*(self._redirect(message, copy) for message, copy in copies))
        failed = {message for (message, _), done in zip(copies, sent, strict=True) if not done}
        await self._ack([message for message in settled if message not in failed])
        return {message: fallback(settled[message][1]) for message in failed}

    async def _requeue_later(self, message: Delivery, settlement: Settlement) -> None:
        """The fallback when no copy could be published: after :data:`FALLBACK_SECONDS` (cut
        short by a shutdown) the delivery goes back to the order queue (nack), or, for a dead
        letter without a router, is rejected to the queue's dead-letter exchange."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), FALLBACK_SECONDS)
        async with self._frames:
            self._unsettled.discard(message)
            try:
                if self._router is None and settlement.action is Action.DEAD:
                    await message.reject(requeue=False)
                else:
                    await message.nack(requeue=True)
            except CONNECTION_EXCEPTIONS as exc:
                log.warning("requeue_failed", message_id=message.message_id, error=repr(exc))

    async def _redirect(self, message: Delivery, copy: Copy) -> bool:
        """Publish a copy of ``message`` (or of part of its group) to a retry queue or the
        dead-letter queue; True once the broker confirmed it."""
        if self._router is None:
            return False
        settlement = copy.settlement
        message_id = copy.message_id or message.message_id
        try:
            if settlement.action is Action.DEAD:
                await self._router.dead_letter(
                    message,
                    settlement.reason,
                    settlement.detail,
                    body=copy.body,
                    message_id=copy.message_id,
                    correlation_id=copy.correlation_id,
                )
                log.error("dead_lettered", message_id=message_id, reason=settlement.reason, error=settlement.detail)
                self._count("dead_lettered")
            else:
                delay = await self._router.retry(message, settlement.detail, body=copy.body, message_id=copy.message_id)
                log.info("retry_later", message_id=message_id, seconds=delay, why=settlement.reason)
                self._count("retried")
        except Exception as exc:  # the broker is failing too: requeue instead
            log.warning("redirect_failed", message_id=message.message_id, error=repr(exc))
            return False
        return True

    async def _ack(self, messages: list[Delivery]) -> None:
        """Ack ``messages``. On each channel, those below every other unsettled delivery of that
        channel are acked with one ``multiple`` ack of the latest of them (one frame, where one
        ack per message costs the broker more than the write); the rest one by one. Settling
        frames go out one call at a time (``_frames``), so a ``multiple`` ack never covers a
        delivery another task is about to nack (the broker would close the channel). An ack
        that cannot be sent because its channel closed is logged: the broker has put those
        deliveries back, and their orders' request ids make the redeliveries duplicates."""
        if not messages:
            return
        async with self._frames:
            self._unsettled.difference_update(messages)
            by_channel: dict[AbstractAMQPChannel, list[Delivery]] = defaultdict(list)
            for message in messages:
                by_channel[message.channel].append(message)
            for channel, acked in by_channel.items():
                try:
                    await self._ack_on(channel, acked)
                except CONNECTION_EXCEPTIONS as exc:
                    log.warning("ack_failed", deliveries=len(acked), error=repr(exc))

    async def _ack_on(self, channel: AbstractAMQPChannel, messages: list[Delivery]) -> None:
        if len(messages) == 1:
            await messages[0].ack()
            return
        floor = min((m.delivery_tag for m in self._unsettled if m.channel is channel), default=None)
        below = [m for m in messages if floor is None or m.delivery_tag < floor]
        if below:
            await max(below, key=lambda message: message.delivery_tag).ack(multiple=True)
        for message in messages:
            if floor is not None and message.delivery_tag > floor:
                await message.ack()

    async def drain(self) -> None:
        """Wait until every delivery taken is settled (used on SIGTERM, after the subscription
        stopped): the batches in hand are written, committed and settled."""
        self._stopping.set()
        while self._waiting or self._alone or self._writers:
            await asyncio.gather(*self._alone, *self._writers, return_exceptions=True)
            await asyncio.sleep(0)  # deliveries read before the subscription stopped
