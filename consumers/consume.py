"""``flashsale consume``: an :class:`consumers.order_consumer.OrderConsumer` wired to the order
queues (:func:`consuming`), run until a stop signal (:func:`run_consumer`)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Collection

import structlog
from aio_pika.abc import AbstractChannel

from consumers import worker_metrics
from consumers.order_consumer import OrderConsumer
from service.adapters.broker_connection import connect_when_up
from service.adapters.broker_topology import declare_topology
from service.adapters.retry_routing import RetryRouter
from service.adapters.subscription import Subscription
from service.bootstrap import Resources
from service.runtime import freeze_startup_heap, stop_signal
from service.settings import AMQPSettings

log = structlog.get_logger(__name__)

PREFETCH_ORDERS = 512
"""Orders in hand per consumer and order queue when no prefetch is given (:func:`default_prefetch`):
what three batch writers of 100 and the batch gathering behind them use, with room to spare."""


def default_prefetch(amqp: AMQPSettings) -> int:
    """Deliveries in hand per order queue: ``FLASHSALE_AMQP__PREFETCH``, else as many messages as
    carry :data:`PREFETCH_ORDERS` orders at ``group_max`` orders each. A prefetch counted in
    messages alone let the first of two consumers started on a backlog of groups take 256 groups
    (16,384 of 20,000 orders) and the second go idle (docs/BENCHMARKS.md, "The consumer drain")."""
    return amqp.prefetch or -(-PREFETCH_ORDERS // amqp.group_max)


@contextlib.asynccontextmanager
async def consuming(
    amqp: AMQPSettings, consumer: OrderConsumer, prefetch: int, partitions: Collection[int] | None = None
) -> AsyncIterator[None]:
    """``consumer`` takes deliveries from the order queues of ``partitions`` (every partition when
    None; topology declared, at most ``prefetch`` in hand per queue) on a robust connection of its
    own while the block runs, and sends retries and dead letters on a confirming channel of that
    connection; on exit it stops taking deliveries, finishes and settles those in hand, and
    closes the connection. A broker that is away at start is waited for
    (:func:`service.adapters.broker_connection.connect_when_up`).

    Raises:
        ValueError: a partition outside 0 … ``amqp.partitions`` − 1 (before connecting).
    """
    chosen = amqp.chosen_partitions(partitions)
    connection = await connect_when_up(amqp, "consumer")
    try:
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=prefetch)  # per consumer, so per queue (quorum queues refuse a global one)
        _, queues = await declare_topology(channel, amqp)

        async def confirming() -> AbstractChannel:
            return await connection.channel(publisher_confirms=True, on_return_raises=True)

        consumer.route_with(RetryRouter(await confirming(), amqp, confirming))
        subscription = Subscription(channel, [queues[partition].name for partition in chosen], consumer.handle)
        await subscription.start()
        try:
            yield
        finally:
            await subscription.stop()
            await consumer.drain()
    finally:
        await connection.close()


async def run_consumer(
    resources: Resources,
    prefetch: int | None = None,
    metrics_port: int | None = None,
    partitions: Collection[int] | None = None,
) -> None:
    """Consume until SIGTERM/SIGINT, then stop taking messages, finish those in hand, and return.
    ``prefetch``: deliveries in hand at most, per order queue (None: :func:`default_prefetch`); batches of
    ``FLASHSALE_AMQP__BATCH_SIZE`` at most. ``metrics_port``: where ``/metrics`` is served (None
    or 0: not served; queue depths are sampled all the same). ``partitions``: the order queues
    taken (every partition when None)."""
    settings = resources.settings
    prefetch = prefetch or default_prefetch(settings.amqp)
    consumer = OrderConsumer(
        resources.engine,
        resources.store,
        settings.orders.replay_ttl_seconds,
        batch_size=settings.amqp.batch_size,
        linger_seconds=settings.amqp.batch_linger_ms / 1000,
        writers=settings.amqp.batch_writers,
    )
    queues = [settings.amqp.partition_queue(p) for p in settings.amqp.chosen_partitions(partitions)]
    try:
        with stop_signal() as stop:
            async with (
                worker_metrics.exposed(settings, metrics_port),
                consuming(settings.amqp, consumer, prefetch, partitions),
            ):
                freeze_startup_heap()
                log.info("consuming", queues=queues, prefetch=prefetch, batch_size=settings.amqp.batch_size)
                await stop.wait()
                log.info("stopping", in_hand=consumer.in_hand)
    finally:
        log.info("stopped", **consumer.counts)
