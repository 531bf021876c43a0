"""RabbitMQ: topology, the order message, and the confirmed publisher.

Topology: a durable direct exchange routes to a durable quorum queue whose dead-letter exchange
leads to a durable dead-letter queue; ``x-delivery-limit`` bounds redeliveries of one message.
"""

from __future__ import annotations

import aio_pika
import msgspec
import structlog
from aio_pika.abc import (
    AbstractChannel,
    AbstractExchange,
    AbstractQueue,
    AbstractRobustConnection,
)
from aio_pika.exceptions import CONNECTION_EXCEPTIONS

from service.settings import AMQPSettings

log = structlog.get_logger(__name__)


class OrderMessage(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """An accepted reservation, to be written to MySQL by the consumer (JSON body).

    ``quantity`` in units; ``reserved_at_ms`` in Unix milliseconds (Redis server time);
    ``amount`` in minor currency units, priced when the stock was reserved.
    """

    request_id: str
    order_no: str
    user_id: str
    product_id: int
    quantity: int
    reserved_at_ms: int
    amount: int


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(OrderMessage)


def encode_order(message: OrderMessage) -> bytes:
    """JSON body of an order message."""
    return _encoder.encode(message)


def decode_order(body: bytes) -> OrderMessage:
    """Raises ``msgspec.DecodeError``/``msgspec.ValidationError`` for a body that is not an order."""
    return _decoder.decode(body)


class PublishFailed(Exception):
    """The broker did not confirm the message (nack, unroutable, timeout or connection down)."""


async def declare_topology(channel: AbstractChannel, settings: AMQPSettings) -> tuple[AbstractExchange, AbstractQueue]:
    """Declare (idempotently) the order exchange, quorum queue, dead-letter exchange and queue."""
    dlx = await channel.declare_exchange(settings.dead_letter_exchange, aio_pika.ExchangeType.DIRECT, durable=True)
    dead = await channel.declare_queue(settings.dead_letter_queue, durable=True, arguments={"x-queue-type": "quorum"})
    await dead.bind(dlx, routing_key=settings.queue)
    exchange = await channel.declare_exchange(settings.exchange, aio_pika.ExchangeType.DIRECT, durable=True)
    queue = await channel.declare_queue(
        settings.queue,
        durable=True,
        arguments={
            "x-queue-type": "quorum",
            "x-dead-letter-exchange": settings.dead_letter_exchange,
            "x-dead-letter-routing-key": settings.queue,
            "x-delivery-limit": settings.delivery_limit,
        },
    )
    await queue.bind(exchange, routing_key=settings.queue)
    return exchange, queue


async def queue_depth(channel: AbstractChannel, name: str) -> int:
    """Messages ready in queue ``name``, asked of the broker now (a passive declare through
    aio-pika's channel would answer from its cache of earlier declarations)."""
    underlay = await channel.get_underlay_channel()
    declared = await underlay.queue_declare(name, passive=True)
    return declared.message_count or 0  # the broker always sends it; aiormq types it optional


class Publisher:
    """One robust connection and ``settings.publish_channels`` confirming channels per process,
    used in turn (confirms on one channel come back in order; several channels let the broker
    confirm concurrent publishes side by side).

    ``publish`` returns only after the broker confirmed the message (persistent, mandatory).
    """

    def __init__(self, settings: AMQPSettings) -> None:
        self._settings = settings
        self._connection: AbstractRobustConnection | None = None
        self._channels: list[AbstractChannel] = []
        self._exchanges: list[AbstractExchange] = []
        self._turn = 0

    async def connect(self) -> None:
        """Open the robust connection and the confirming channels; declare the topology."""
        self._connection = await aio_pika.connect_robust(self._settings.url)
        for _ in range(self._settings.publish_channels):
            channel = await self._connection.channel(publisher_confirms=True, on_return_raises=True)
            if not self._exchanges:
                exchange, _ = await declare_topology(channel, self._settings)
            else:
                exchange = await channel.get_exchange(self._settings.exchange)
            self._channels.append(channel)
            self._exchanges.append(exchange)

    async def close(self) -> None:
        """Close the connection (and its channels)."""
        if self._connection is not None:
            await self._connection.close()

    @property
    def ready(self) -> bool:
        """True when the connection and every channel are open."""
        return (
            self._connection is not None
            and not self._connection.is_closed
            and bool(self._channels)
            and not any(channel.is_closed for channel in self._channels)
        )

    async def publish(self, order: OrderMessage) -> None:
        """Publish ``order`` and wait for the publisher confirm.

        Raises:
            PublishFailed: nack, unroutable (returned), no confirm within ``confirm_timeout``
                seconds, or the connection is down. The message may still have reached the
                broker after a timeout; the consumer's claim on the reservation settles that.
        """
        if not self.ready:
            raise PublishFailed("broker connection is down")
        self._turn = (self._turn + 1) % len(self._exchanges)
        exchange = self._exchanges[self._turn]
        message = aio_pika.Message(
            encode_order(order),
            content_type="application/json",
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            message_id=order.request_id,
        )
        try:
            await exchange.publish(
                message, routing_key=self._settings.queue, mandatory=True, timeout=self._settings.confirm_timeout
            )
        except (TimeoutError, *CONNECTION_EXCEPTIONS) as exc:
            log.warning("publish_failed", request_id=order.request_id, error=repr(exc))
            raise PublishFailed(repr(exc)) from exc
