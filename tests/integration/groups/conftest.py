"""Fixtures of the group tests: order queues of the test's own (:func:`tests.support.own_queues`),
so what lands in them is the test's alone, and a plain channel on them."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aio_pika
import pytest

from service.adapters.broker_topology import declare_topology
from service.model.order_message import GROUP_FORMAT, OrderGroup, OrderMessage, encode_group, orders_of
from service.settings import Settings
from tests.support import own_queues

LINGER_MS = 50.0
"""The tests' linger, fixed (not adaptive): long enough that the orders of one burst of requests
share a group on a busy box (the default is for production throughput, not for a test's
determinism; the adaptive linger has tests of its own)."""


@pytest.fixture
async def own(settings: Settings, product_id: int) -> AsyncIterator[Settings]:
    """Settings with queues of their own and groups of up to 64 orders lingering ``LINGER_MS``."""
    async with own_queues(
        settings, f"groups-{product_id}", group_max=64, group_linger_ms=LINGER_MS, group_linger_adaptive=False
    ) as mine:
        yield mine


@pytest.fixture
async def channel(own: Settings) -> AsyncIterator[aio_pika.abc.AbstractChannel]:
    connection = await aio_pika.connect(own.amqp.url)
    try:
        channel = await connection.channel()
        await declare_topology(channel, own.amqp)
        yield channel
    finally:
        await connection.close()


def group_body(orders: list[OrderMessage], group_id: str = "g" * 32) -> bytes:
    """A group body as the publisher writes it."""
    return encode_group(OrderGroup(GROUP_FORMAT, group_id, orders))


async def take_all(channel: aio_pika.abc.AbstractChannel, queue: str) -> list[aio_pika.abc.AbstractIncomingMessage]:
    """Every message ready in ``queue``, taken (acked)."""
    taken = []
    source = await channel.get_queue(queue, ensure=False)
    while (message := await source.get(fail=False, timeout=5)) is not None:
        await message.ack()
        taken.append(message)
    return taken


def orders_in(messages: list[aio_pika.abc.AbstractIncomingMessage]) -> list[OrderMessage]:
    return [order for message in messages for order in orders_of(message.body)]
