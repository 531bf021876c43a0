"""Taking deliveries from queues through a robust channel's aiormq layer.

aio-pika wraps every delivery in an ``IncomingMessage`` (it decodes the properties into some
twenty attributes) and runs the callback in a task of its own beside the one aiormq already
runs it in. For the consumer, which only reads the body, two properties and, on its rare
retry and dead-letter paths, the headers, that was about a third of what receiving a message
costs (docs/BENCHMARKS.md). Here a delivery stays aiormq's ``DeliveredMessage``
behind a small :class:`Delivery`, and :class:`Subscription` subscribes again each time the
robust channel reopens (after a lost connection, or a channel the broker closed), as aio-pika's
robust queues do for their own consumers; the queues themselves are declared again by the
channel (they were declared through it, :func:`service.adapters.broker_topology.declare_topology`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import aiormq
import structlog
from aio_pika.abc import AbstractRobustChannel
from aio_pika.exceptions import CONNECTION_EXCEPTIONS
from aiormq.abc import DeliveredMessage
from pamqp import commands as spec

from service.failures import translate

log = structlog.get_logger(__name__)

STOP_SECONDS = 5.0
"""How long :meth:`Subscription.stop` tries to cancel its consumers."""
RESUBSCRIBE_SECONDS = 1.0
"""How long to wait before subscribing again to a queue whose consumer the broker cancelled (the
queue was deleted, or its node is going away)."""


class Delivery:
    """One message delivered to a consumer: its ``body`` (bytes), ``delivery_tag`` (the
    channel's), the properties the consumer reads, and the settling calls of the channel it came
    on (after that channel closed they raise ``aiormq.exceptions.ChannelInvalidStateError``: the
    broker has put the message back already). Compared by identity."""

    __slots__ = ("_raw", "body", "channel", "delivery_tag")

    def __init__(self, raw: DeliveredMessage) -> None:
        self._raw = raw
        self.body: bytes = raw.body
        self.channel: aiormq.abc.AbstractChannel = raw.channel
        self.delivery_tag: int = raw.delivery_tag or 0

    @property
    def message_id(self) -> str | None:
        return self._raw.header.properties.message_id

    @property
    def correlation_id(self) -> str | None:
        return self._raw.header.properties.correlation_id

    @property
    def content_type(self) -> str | None:
        return self._raw.header.properties.content_type

    @property
    def headers(self) -> dict[str, Any]:
        return dict(self._raw.header.properties.headers or {})

    @property
    def routing_key(self) -> str | None:
        return self._raw.routing_key

    async def ack(self, multiple: bool = False) -> None:
        """Ack this delivery (with ``multiple``: and every earlier one of its channel)."""
        await self.channel.basic_ack(self.delivery_tag, multiple=multiple)

    async def nack(self, requeue: bool = True) -> None:
        """Give this delivery back to its queue (``requeue``) or to the queue's dead-letter exchange."""
        await self.channel.basic_nack(self.delivery_tag, requeue=requeue)

    async def reject(self, requeue: bool = False) -> None:
        """Reject this delivery: to the queue's dead-letter exchange unless ``requeue``."""
        await self.channel.basic_reject(self.delivery_tag, requeue=requeue)


class Subscription:
    """``on_delivery`` is called (synchronously, in the task aiormq runs per delivery) with every
    delivery of ``queues`` on ``channel`` (not acked: the callee settles each) from
    :meth:`start` to :meth:`stop`, across reopened channels and broker-cancelled consumers."""

    def __init__(
        self, channel: AbstractRobustChannel, queues: Sequence[str], on_delivery: Callable[[Delivery], None]
    ) -> None:
        self._channel = channel
        self._queues = list(queues)
        self._on_delivery = on_delivery
        self._tags: dict[str, str] = {}  # consumer tag -> queue, on the current underlay channel
        self._stopped = False
        self._retries: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        """Subscribe to every queue; from now on, again after every reopen of the channel.

        Raises:
            service.failures.StoreUnavailable: the connection or channel failed (``"rabbitmq"``).
            aiormq.exceptions.AMQPError: a queue could not be consumed (missing, exclusive).
        """
        self._channel.reopen_callbacks.add(self._reopened)
        try:
            await self._subscribe_all()
        except Exception as exc:
            if (failure := translate(exc)) is None:
                raise
            raise failure from exc

    async def stop(self) -> None:
        """Stop taking deliveries (deliveries in hand stay the callee's to settle). Best effort
        within :data:`STOP_SECONDS`: with the broker away there is nothing to cancel (closing
        the connection ends the consumers), and deliveries that still come are the callee's."""
        self._stopped = True
        self._channel.reopen_callbacks.discard(self._reopened)
        for task in list(self._retries):
            task.cancel()
        if self._channel.is_closed:
            return
        with contextlib.suppress(*CONNECTION_EXCEPTIONS, TimeoutError):
            async with asyncio.timeout(STOP_SECONDS):
                underlay = await self._channel.get_underlay_channel()
                for tag in list(self._tags):
                    await underlay.basic_cancel(tag)
        self._tags.clear()

    async def _subscribe_all(self) -> None:
        underlay = await self._channel.get_underlay_channel()
        self._tags.clear()
        underlay.on_consumer_cancel_callbacks.add(self._cancelled)  # a set: once per channel
        for queue in self._queues:
            await self._subscribe(underlay, queue)

    async def _subscribe(self, underlay: aiormq.abc.AbstractChannel, queue: str) -> None:
        ok = await underlay.basic_consume(queue, self._deliver)
        assert ok.consumer_tag is not None
        self._tags[ok.consumer_tag] = queue

    async def _deliver(self, raw: DeliveredMessage) -> None:
        self._on_delivery(Delivery(raw))

    async def _reopened(self, _channel: Any) -> None:
        if self._stopped:
            return
        try:
            await self._subscribe_all()
        except Exception as exc:  # a failure that closed the channel reopens it, and we come back here
            log.error("resubscribe_failed", queues=self._queues, error=repr(exc))
        else:
            log.info("resubscribed", queues=self._queues)

    def _cancelled(self, frame: spec.Basic.Cancel) -> None:
        queue = self._tags.pop(frame.consumer_tag or "", None)
        if queue is None or self._stopped:
            return
        log.warning("consumer_cancelled_by_broker", queue=queue)
        task = asyncio.get_running_loop().create_task(self._resubscribe(queue))
        self._retries.add(task)
        task.add_done_callback(self._retries.discard)

    async def _resubscribe(self, queue: str) -> None:
        """Subscribe to ``queue`` again after :data:`RESUBSCRIBE_SECONDS`. A queue that is gone
        makes the broker close the channel (404), and the reopened channel declares it again."""
        await asyncio.sleep(RESUBSCRIBE_SECONDS)
        try:
            await self._subscribe(await self._channel.get_underlay_channel(), queue)
        except Exception as exc:
            log.warning("resubscribe_failed", queues=[queue], error=repr(exc))
        else:
            log.info("resubscribed", queues=[queue])
