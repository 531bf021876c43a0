"""Metrics of the long-running workers (the consumer, the realign and sweep jobs): counts of
settled messages, batch sizes, the queue depths sampled, and the ``/metrics`` server each serves
(families in :mod:`service.metrics`)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Sequence

import aio_pika
import structlog

from service import metrics
from service.adapters.broker_connection import connect_when_up
from service.adapters.broker_topology import queue_depth
from service.domain.fulfilment.order_writer import Outcome
from service.model.order_message import OrderMessage
from service.runtime import OutageLog, stop_task
from service.settings import Settings

log = structlog.get_logger(__name__)

QUEUE_SAMPLE_SECONDS = 5.0
"""How often the consumer asks the broker for the order and dead-letter queue depths."""

_WRITTEN = (Outcome.APPLIED, Outcome.REJECTED)
# Local sums (service.metrics), handed to prometheus_client every FLUSH_SECONDS by exposed(): a
# drain settles ~10,000 messages a second per process, and a labelled child's inc() and a
# histogram's observe() each take the family's lock and, in multiprocess mode, write its file.
_BATCH_SIZE = metrics.local_histogram(metrics.BATCH_SIZE)
_RESERVATION_TO_ROW = metrics.local_histogram(metrics.RESERVATION_TO_ROW_SECONDS)


def count(outcome: str) -> None:
    """One message settled with ``outcome`` (an :class:`Outcome` value, ``invalid`` or ``failed``),
    or sent on (``retried``, ``dead_lettered``); exposed within ``metrics.FLUSH_SECONDS``."""
    metrics.local_counter(metrics.CONSUMER_MESSAGES, outcome).inc()


def written(orders: Sequence[OrderMessage], outcomes: Sequence[Outcome]) -> None:
    """A committed batch: its size, and for each order that got its row the time since its
    reservation (Redis server time against this host's clock); exposed within
    ``metrics.FLUSH_SECONDS``."""
    _BATCH_SIZE.observe(len(orders))
    now_ms = time.time() * 1000
    for order, outcome in zip(orders, outcomes, strict=True):
        if outcome in _WRITTEN:
            _RESERVATION_TO_ROW.observe(max(0.0, (now_ms - order.reserved_at_ms) / 1000))


async def _sample_queue_depths(settings: Settings) -> None:
    """Set ``flashsale_queue_depth_messages`` every :data:`QUEUE_SAMPLE_SECONDS` (own connection)."""
    amqp = settings.amqp
    gauges = {
        "orders": amqp.partition_queues(),
        "retry": amqp.retry_queues(),
        "dead_letter": [amqp.dead_letter_queue],
    }
    connection = await connect_when_up(amqp, "queue_depths")
    sampling = OutageLog("queue_depth_sample")  # one line per outage, not one per sample
    channel: aio_pika.abc.AbstractChannel | None = None
    try:
        while True:
            try:  # a sample missed is not worth stopping the consumer for
                if channel is None or channel.is_closed:
                    channel = await connection.channel()
                for label, queues in gauges.items():
                    metrics.QUEUE_DEPTH.labels(label).set(sum([await queue_depth(channel, queue) for queue in queues]))
            except Exception as exc:
                sampling.failed(exc)
                channel = None
            else:
                sampling.recovered()
            await asyncio.sleep(QUEUE_SAMPLE_SECONDS)
    finally:
        await connection.close()


@contextlib.asynccontextmanager
async def exposed(settings: Settings, port: int | None, *, sample_queues: bool = True) -> AsyncIterator[None]:
    """Metrics of a consumer (with ``sample_queues``), realignment or sweep process while the block
    runs: served on ``port`` (default ``FLASHSALE_METRICS__PORT``; 0: not served), local sums
    flushed, queue depths sampled."""
    async with metrics.exposed(settings.metrics.port if port is None else port, settings.metrics.host):
        sampler = asyncio.create_task(_sample_queue_depths(settings)) if sample_queues else None
        try:
            yield
        finally:
            if sampler is not None:
                with contextlib.suppress(Exception):
                    await stop_task(sampler)
