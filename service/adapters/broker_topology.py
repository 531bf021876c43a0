"""RabbitMQ topology: the queues and exchanges order messages travel through, declared, deleted,
found and measured (the publisher: :mod:`service.adapters.broker`).


Topology: a durable direct exchange routes to a durable quorum queue whose dead-letter exchange
leads to a durable dead-letter queue; ``x-delivery-limit`` bounds redeliveries of one message
(a consumer that dies holding it, again and again). Beside them, one retry queue per retry delay
(``FLASHSALE_AMQP__RETRY_DELAYS``): a quorum queue with that message TTL whose dead-letter
exchange is the order exchange, so a message the consumer puts there comes back to the order
queue when its time is up, as a new delivery (its delivery count starts again: a transient
failure never spends the delivery limit meant for poison). Quorum queues expire messages only at
the head of the queue, so each delay has a queue of its own (a per-message TTL in one queue
would hold short waits behind long ones); they dead-letter ``at-least-once`` (RabbitMQ 3.10+,
which requires ``x-overflow: reject-publish``): a message leaves a retry queue only once the
order queue confirmed it, where the default ``at-most-once`` would lose it if the order queue
were unavailable at that moment.

Partitions (``FLASHSALE_AMQP__PARTITIONS``, N): N order queues, each with its own retry queues,
and a product's orders always go to the same one (:meth:`AMQPSettings.queue_of`), so a batching
consumer finds one product's orders together; one dead-letter queue serves them all. With N = 1
the names are those of a single queue (``queue``, ``<queue>.retry.<ms>ms``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable

import aio_pika
import aiormq
import msgspec
from aio_pika.abc import AbstractChannel, AbstractExchange, AbstractQueue

from service.adapters.broker_connection import connect_once
from service.model.order_message import orders_of
from service.settings import AMQPSettings


def partition_of_body(settings: AMQPSettings, body: bytes) -> int | None:
    """The partition of the product of the orders ``body`` carries (a group's orders share one
    partition); None when it is no order."""
    try:
        orders = orders_of(body)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    return settings.partition_of(orders[0].product_id) if orders else None


async def declare_topology(
    channel: AbstractChannel, settings: AMQPSettings
) -> tuple[AbstractExchange, list[AbstractQueue]]:
    """Declare (idempotently) the order exchange, the order queues (one per partition, partition 0
    first; returned with the exchange), their retry queues, the dead-letter exchange and the one
    dead-letter queue all partitions share.

    Each partition's queue is bound with its own name as routing key
    (:meth:`AMQPSettings.partition_queue`), and each of its retry queues dead-letters back with
    that key; every partition dead-letters to the dead-letter exchange with the key ``queue``,
    the one the dead-letter queue is bound with."""
    dlx = await channel.declare_exchange(settings.dead_letter_exchange, aio_pika.ExchangeType.DIRECT, durable=True)
    dead = await channel.declare_queue(settings.dead_letter_queue, durable=True, arguments={"x-queue-type": "quorum"})
    await dead.bind(dlx, routing_key=settings.queue)
    exchange = await channel.declare_exchange(settings.exchange, aio_pika.ExchangeType.DIRECT, durable=True)
    queues = []
    for partition, name in enumerate(settings.partition_queues()):
        queue = await channel.declare_queue(
            name,
            durable=True,
            arguments={
                "x-queue-type": "quorum",
                "x-dead-letter-exchange": settings.dead_letter_exchange,
                "x-dead-letter-routing-key": settings.queue,
                "x-delivery-limit": settings.delivery_limit,
            },
        )
        await queue.bind(exchange, routing_key=name)
        queues.append(queue)
        for delay in sorted(set(settings.retry_delays)):
            await channel.declare_queue(
                settings.retry_queue(delay, partition),
                durable=True,
                arguments={
                    "x-queue-type": "quorum",
                    "x-message-ttl": round(delay * 1000),
                    "x-dead-letter-exchange": settings.exchange,
                    "x-dead-letter-routing-key": name,
                    "x-dead-letter-strategy": "at-least-once",
                    "x-overflow": "reject-publish",
                },
            )
    return exchange, queues


async def delete_topology(settings: AMQPSettings) -> None:
    """Delete the order queues of every partition, their retry queues, the dead-letter queue and
    the exchanges that :func:`declare_topology` declares (their messages with them), on a
    connection of its own; for isolated runs (the sale, tests) that remove everything
    they made."""
    connection = await connect_once(settings)
    try:
        channel = await connection.channel()
        for queue in (*settings.retry_queues(), *settings.partition_queues(), settings.dead_letter_queue):
            await channel.queue_delete(queue)
        for exchange in (settings.exchange, settings.dead_letter_exchange):
            await channel.exchange_delete(exchange)
    finally:
        await connection.close()


async def existing_topology(url: str, settings: AMQPSettings) -> tuple[dict[str, tuple[int, int]], list[str]]:
    """Which of the queues and exchanges :func:`delete_topology` deletes exist at ``url``:
    ``({queue: (messages, consumers)}, [exchange, ...])``, asked by passive declares, each on a
    channel of its own (the broker closes the channel of a declare that finds nothing)."""
    connection = await aio_pika.connect(url)
    queues: dict[str, tuple[int, int]] = {}
    exchanges: list[str] = []
    try:
        for queue in (*settings.partition_queues(), *settings.retry_queues(), settings.dead_letter_queue):
            with contextlib.suppress(aiormq.exceptions.ChannelNotFoundEntity):
                underlay = await (await connection.channel()).get_underlay_channel()
                found = await underlay.queue_declare(queue, passive=True)
                queues[queue] = (found.message_count or 0, found.consumer_count or 0)
        for exchange in (settings.exchange, settings.dead_letter_exchange):
            with contextlib.suppress(aiormq.exceptions.ChannelNotFoundEntity):
                underlay = await (await connection.channel()).get_underlay_channel()
                await underlay.exchange_declare(exchange, passive=True)
                exchanges.append(exchange)
    finally:
        await connection.close()
    return queues, exchanges


async def queue_depths(channel: AbstractChannel, names: Iterable[str]) -> int:
    """Messages ready in the queues ``names`` together (:func:`queue_depth` of each)."""
    return sum([await queue_depth(channel, name) for name in names])


async def queue_depth(channel: AbstractChannel, name: str) -> int:
    """Messages ready in queue ``name``, asked of the broker now (a passive declare through
    aio-pika's channel would answer from its cache of earlier declarations)."""
    underlay = await channel.get_underlay_channel()
    declared = await underlay.queue_declare(name, passive=True)
    return declared.message_count or 0  # the broker always sends it; aiormq types it optional
