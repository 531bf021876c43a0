"""``flashsale consume``: take order messages from RabbitMQ and write them to MySQL in batches.

Every delivery runs in its own task (aio-pika's): it is decoded, then waits in the batch being
gathered. One writer task per consumer takes up to ``batch_size`` waiting orders (whatever
arrived, lingering ``linger_seconds`` for more while fewer wait) and hands them to
:class:`service.domain.order_writer.OrderWriter`: one Redis claim round trip, one MySQL
transaction. Each delivery then gets one :class:`Verdict`, and :meth:`OrderConsumer._settle` is
the one place where verdicts become broker actions:

- ``ACK``: written (applied or rejected), a duplicate, or released by the API: acked (one
  ``multiple`` ack where the window allows).
- ``RETRY``: a transient failure (MySQL unreachable or failing over, deadlocks or lock waits past
  the transaction's own retries): a copy goes to the retry queue of its turn (1, 2, 5, 10, 30 s
  by default, ``FLASHSALE_AMQP__RETRY_DELAYS``) and the delivery is acked, so nothing waits out a
  back-off in the prefetch window and an outage never spends the order queue's delivery limit
  (kept for a message that kills the consumer). The copy comes back to the order queue by
  itself (:mod:`service.adapters.broker`). A failure that is not known to be transient and
  persists for one order alone is retried :data:`MAX_FAILED_WRITES` times, then dead-lettered.
- ``DEAD``: a permanent failure (undecodable or out-of-domain body, unknown product, an order
  number that cannot be written at all): dead-lettered at once with a reason header
  (:mod:`service.adapters.redirect`), without holding up the rest of its batch.

A failed batch whose error is not known to be transient is written again order by order, so one
poison order cannot fail the others. If a copy cannot be published (the broker is failing too),
the delivery is requeued (nack) instead: then, and only then, the delivery limit counts.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Collection
from dataclasses import dataclass
from enum import Enum

import structlog
from aio_pika.abc import AbstractChannel, AbstractIncomingMessage
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from sqlalchemy.ext.asyncio import AsyncEngine

from consumers import observe
from db.engine import is_retryable, is_unreachable
from service.adapters.broker import OrderMessage, connect_when_up, declare_topology
from service.adapters.redirect import Redirector, retries_of
from service.adapters.redis.stock_store import StockStore
from service.bootstrap import Resources
from service.domain.order_writer import InvalidOrder, OrderWriter, Outcome, parse_order
from service.runtime import stop_signal
from service.settings import AMQPSettings

log = structlog.get_logger(__name__)

BATCH_LINGER_SECONDS = 0.005  # how long a short batch waits for more deliveries
FALLBACK_SECONDS = 1.0
"""How long a delivery whose retry or dead-letter copy could not be published waits before it
is requeued (the broker is failing: no hot loop of redeliveries)."""
MAX_FAILED_WRITES = 5
"""Retries of one order that fails alone with an error not known to be transient (a bug, a
schema the code does not expect) before it is dead-lettered (``write_failed``)."""


class Action(Enum):
    ACK = "ack"
    RETRY = "retry"
    DEAD = "dead"


@dataclass(frozen=True, slots=True)
class Verdict:
    """What becomes of one delivery: ``action``, and for ``RETRY``/``DEAD`` why (``reason``: the
    dead-letter reason; ``detail``: the error)."""

    action: Action
    reason: str = ""
    detail: str = ""


ACK = Verdict(Action.ACK)
_DEAD_OUTCOMES = {Outcome.UNKNOWN_PRODUCT: "unknown_product", Outcome.CONFLICT: "order_no_conflict"}


def is_transient(exc: BaseException) -> bool:
    """A failure that passes by itself: MySQL unreachable, gone away, restarting, read-only
    while failing over, out of connections (SQLAlchemy ``OperationalError``/``InterfaceError``,
    no pooled connection in time), deadlocks or lock waits past the transaction's retries, a
    socket error or timeout."""
    return (
        is_unreachable(exc)
        or is_retryable(exc)
        or isinstance(exc, OperationalError | InterfaceError | PoolTimeoutError | OSError | TimeoutError)
        or (isinstance(exc, DBAPIError) and exc.connection_invalidated)
    )


@dataclass(slots=True)
class _Delivery:
    """One decoded delivery waiting for (or in) a batch; ``settled`` resolves once the writer is
    done with it: None when its verdict was carried out, the verdict when its copy could not be
    published and its own task is to requeue it (:meth:`OrderConsumer._requeue_later`)."""

    message: AbstractIncomingMessage
    order: OrderMessage
    settled: asyncio.Future[Verdict | None]


class OrderConsumer:
    """Handles the deliveries of one channel in batches, one batch transaction at a time;
    tracks the ones in hand for a clean shutdown. ``batch_size``: orders in one transaction at
    most (a batch never holds more than the prefetch window). Without a :class:`Redirector`
    (:meth:`redirect_with`; :func:`consuming` gives it one) a retry is a requeue and a dead
    letter a reject."""

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
        self._redirector: Redirector | None = None
        self._waiting: list[_Delivery] = []
        self._batch_full = asyncio.Event()
        self._writing: asyncio.Task[None] | None = None
        self._in_hand: set[asyncio.Task[None]] = set()
        self._unsettled: set[AbstractIncomingMessage] = set()  # not yet acked, nacked nor rejected
        self._frames = asyncio.Lock()  # one settling frame (batch) at a time: see _ack
        self._stopping = asyncio.Event()
        self.counts: dict[str, int] = {}

    def redirect_with(self, redirector: Redirector | None) -> None:
        """Send retries and dead letters through ``redirector`` from now on."""
        self._redirector = redirector

    @property
    def in_hand(self) -> int:
        """Deliveries being processed right now."""
        return len(self._in_hand)

    def _count(self, what: str) -> None:
        self.counts[what] = self.counts.get(what, 0) + 1
        observe.count(what)

    async def handle(self, message: AbstractIncomingMessage) -> None:
        """Process one delivery: returns once it is settled (acked after its batch committed,
        sent to a retry queue, or dead-lettered)."""
        task = asyncio.current_task()
        assert task is not None
        self._in_hand.add(task)
        self._unsettled.add(message)
        try:
            await self._handle(message)
        except Exception as exc:  # never leave a delivery unsettled: it would stall the prefetch window
            log.exception("handler_failed", message_id=message.message_id, error=repr(exc))
            if message in self._unsettled:
                verdict = self._failed(message, exc)
                if await self._settle([message], [verdict]):
                    await self._requeue_later(message, verdict)
        finally:
            self._in_hand.discard(task)
            self._unsettled.discard(message)

    async def _handle(self, message: AbstractIncomingMessage) -> None:
        try:
            order = parse_order(message.body)
        except InvalidOrder as exc:
            self._count("invalid")
            verdict = Verdict(Action.DEAD, "invalid_order", str(exc))
            if await self._settle([message], [verdict]):
                await self._requeue_later(message, verdict)
            return
        delivery = _Delivery(message, order, asyncio.get_running_loop().create_future())
        self._enqueue(delivery)
        if (unsent := await delivery.settled) is not None:
            await self._requeue_later(message, unsent)

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
                verdicts = await self._write(batch)
                left = await self._settle([delivery.message for delivery in batch], verdicts)
            except Exception as exc:  # a bug in settling: each delivery's own task settles it
                for delivery in batch:
                    if not delivery.settled.done():
                        delivery.settled.set_exception(exc)
            else:
                for delivery in batch:
                    if not delivery.settled.done():
                        delivery.settled.set_result(left.get(delivery.message))

    async def _write(self, batch: list[_Delivery]) -> list[Verdict]:
        """One verdict per delivery of ``batch``: the batch written in one transaction; when that
        fails with an error not known to be transient, order by order."""
        orders = [delivery.order for delivery in batch]
        try:
            outcomes = await self._writer.write(orders)
        except Exception as exc:
            if is_transient(exc) or len(batch) == 1:
                log.warning("batch_failed", orders=len(batch), transient=is_transient(exc), error=repr(exc))
                for _ in batch:
                    self._count("failed")
                return [self._failed(delivery.message, exc) for delivery in batch]
            log.warning("batch_failed_writing_one_by_one", orders=len(batch), error=repr(exc))
            return [verdict for delivery in batch for verdict in await self._write([delivery])]
        observe.written(orders, outcomes)
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
        verdicts = []
        for delivery, outcome in zip(batch, outcomes, strict=True):
            self._count(outcome.value)
            if outcome in _DEAD_OUTCOMES:
                order = delivery.order
                log.error(
                    outcome.value, request_id=order.request_id, product_id=order.product_id, order_no=order.order_no
                )
                verdicts.append(Verdict(Action.DEAD, _DEAD_OUTCOMES[outcome], f"{outcome.value}: nothing written"))
            else:
                verdicts.append(ACK)
        return verdicts

    def _failed(self, message: AbstractIncomingMessage, exc: BaseException) -> Verdict:
        """The verdict for ``message`` after ``exc``: retried, or dead-lettered when the error is
        not known to be transient and it has been retried :data:`MAX_FAILED_WRITES` times."""
        if not is_transient(exc) and retries_of(message) >= MAX_FAILED_WRITES:
            return Verdict(Action.DEAD, "write_failed", repr(exc))
        return Verdict(Action.RETRY, "transient" if is_transient(exc) else "failed", repr(exc))

    async def _settle(
        self, messages: list[AbstractIncomingMessage], verdicts: list[Verdict]
    ) -> dict[AbstractIncomingMessage, Verdict]:
        """The one place where verdicts become broker actions. Retry and dead-letter copies are
        published (confirmed, side by side), then every delivery settled so is acked together
        with the written ones. Returns the deliveries whose copy could not be published (the
        broker is failing too, or no redirector), with their verdicts: still unsettled, for
        their own tasks to requeue (:meth:`_requeue_later`)."""
        redirected = [(m, v) for m, v in zip(messages, verdicts, strict=True) if v.action is not Action.ACK]
        sent = await asyncio.gather(*(self._redirect(message, verdict) for message, verdict in redirected))
        to_ack = [m for m, v in zip(messages, verdicts, strict=True) if v.action is Action.ACK]
        to_ack += [message for (message, _), done in zip(redirected, sent, strict=True) if done]
        await self._ack(to_ack)
        return {message: verdict for (message, verdict), done in zip(redirected, sent, strict=True) if not done}

    async def _requeue_later(self, message: AbstractIncomingMessage, verdict: Verdict) -> None:
        """The fallback when no copy could be published: after :data:`FALLBACK_SECONDS` (cut
        short by a shutdown) the delivery goes back to the order queue (nack), or, for a dead
        letter without a redirector, is rejected to the queue's dead-letter exchange."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), FALLBACK_SECONDS)
        async with self._frames:
            self._unsettled.discard(message)
            if self._redirector is None and verdict.action is Action.DEAD:
                await message.reject(requeue=False)
            else:
                await message.nack(requeue=True)

    async def _redirect(self, message: AbstractIncomingMessage, verdict: Verdict) -> bool:
        """Publish ``message``'s copy to a retry queue or the dead-letter queue; True once the
        broker confirmed it (the delivery may then be acked)."""
        if self._redirector is None:
            return False
        try:
            if verdict.action is Action.DEAD:
                await self._redirector.dead_letter(message, verdict.reason, verdict.detail)
                log.error("dead_lettered", message_id=message.message_id, reason=verdict.reason, error=verdict.detail)
                self._count("dead_lettered")
            else:
                delay = await self._redirector.retry(message, verdict.detail)
                log.info("retry_later", message_id=message.message_id, seconds=delay, why=verdict.reason)
                self._count("retried")
        except Exception as exc:  # the broker is failing too: requeue instead
            log.warning("redirect_failed", message_id=message.message_id, error=repr(exc))
            return False
        return True

    async def _ack(self, messages: list[AbstractIncomingMessage]) -> None:
        """Ack ``messages``. Those below every other unsettled delivery of the channel are acked
        with one ``multiple`` ack of the latest of them (one frame, where one ack per message
        costs the broker more than the write); the rest one by one. Settling frames go out one
        call at a time (``_frames``), so a ``multiple`` ack never covers a delivery another
        task is about to nack (the broker would close the channel)."""
        if not messages:
            return
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

    async def drain(self) -> None:
        """Wait for every delivery in hand to finish (used on SIGTERM): the batches in hand are
        written, committed and settled."""
        self._stopping.set()
        while self._in_hand:
            await asyncio.gather(*list(self._in_hand), return_exceptions=True)


@contextlib.asynccontextmanager
async def consuming(
    amqp: AMQPSettings, consumer: OrderConsumer, prefetch: int, partitions: Collection[int] | None = None
) -> AsyncIterator[None]:
    """``consumer`` takes deliveries from the order queues of ``partitions`` (every partition when
    None; topology declared, at most ``prefetch`` in hand per queue) on a robust connection of its
    own while the block runs, and sends retries and dead letters on a confirming channel of that
    connection; on exit it stops taking deliveries, finishes and settles those in hand, and
    closes the connection. A broker that is away at start is waited for
    (:func:`service.adapters.broker.connect_when_up`).

    Raises:
        ValueError: a partition outside 0 … ``amqp.partitions`` − 1 (before connecting).
    """
    chosen = amqp.chosen_partitions(partitions)
    connection = await connect_when_up(amqp.url, "consumer")
    try:
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=prefetch)  # per consumer, so per queue (quorum queues refuse a global one)
        _, queues = await declare_topology(channel, amqp)

        async def confirming() -> AbstractChannel:
            return await connection.channel(publisher_confirms=True, on_return_raises=True)

        consumer.redirect_with(Redirector(await confirming(), amqp, confirming))
        tags = [(queues[partition], await queues[partition].consume(consumer.handle)) for partition in chosen]
        try:
            yield
        finally:
            for queue, tag in tags:
                await queue.cancel(tag)
            await consumer.drain()
    finally:
        await connection.close()


async def run_consumer(
    resources: Resources, prefetch: int, metrics_port: int | None = None, partitions: Collection[int] | None = None
) -> None:
    """Consume until SIGTERM/SIGINT, then stop taking messages, finish those in hand, and return.
    ``prefetch``: deliveries in hand at most, per order queue; batches of
    ``FLASHSALE_AMQP__BATCH_SIZE`` at most. ``metrics_port``: where ``/metrics`` is served (None
    or 0: not served; queue depths are sampled all the same). ``partitions``: the order queues
    taken (every partition when None)."""
    settings = resources.settings
    consumer = OrderConsumer(
        resources.engine, resources.store, settings.orders.replay_ttl_seconds, batch_size=settings.amqp.batch_size
    )
    queues = [settings.amqp.partition_queue(p) for p in settings.amqp.chosen_partitions(partitions)]
    try:
        with stop_signal() as stop:
            async with (
                observe.exposed(settings, metrics_port),
                consuming(settings.amqp, consumer, prefetch, partitions),
            ):
                log.info("consuming", queues=queues, prefetch=prefetch, batch_size=settings.amqp.batch_size)
                await stop.wait()
                log.info("stopping", in_hand=consumer.in_hand)
    finally:
        log.info("stopped", **consumer.counts)
