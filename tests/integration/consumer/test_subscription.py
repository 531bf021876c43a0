"""The consumer's subscription (aiormq's layer, not aio-pika's consumers) survives what aio-pika's
robust queues survived: a connection the broker closes, and its order queue deleted under it.
The broker is the shared one; the test acts only on its own connection and queues."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import subprocess

import aio_pika
import pytest

from consumers.consume import consuming
from consumers.order_consumer import OrderConsumer
from service.adapters.broker_topology import declare_topology, queue_depth
from service.model.order_message import encode_order
from tests.support import eventually, inventory, message_for, order_rows, own_queues, publish_raw, rows_are

pytestmark = pytest.mark.skipif(shutil.which("rabbitmqctl") is None, reason="needs rabbitmqctl on this host")


async def _ctl(*args: str) -> str:
    done = await asyncio.to_thread(
        subprocess.run, ["rabbitmqctl", *args], capture_output=True, text=True, timeout=60, check=True
    )
    return done.stdout


async def _connections_consuming(queue: str) -> list[str]:
    """The broker's process ids of the connections with a consumer on ``queue``."""
    channel_pids = {
        pid for name, pid in _table(await _ctl("list_consumers", "-q", "queue_name", "channel_pid")) if name == queue
    }
    channels = _table(await _ctl("list_channels", "-q", "pid", "connection"))
    return sorted({connection for pid, connection in channels if pid in channel_pids})


def _table(text: str) -> list[list[str]]:
    """The rows of a ``rabbitmqctl -q list_*`` answer (tab-separated, a header line first)."""
    return [line.split("\t") for line in text.splitlines()[1:] if line.strip()]


async def _publish(channel, settings, orders) -> None:
    await asyncio.gather(*(publish_raw(channel, settings, encode_order(order)) for order in orders))


@contextlib.asynccontextmanager
async def _consumed(settings, name: str, consumer: OrderConsumer):
    """Queues of the test's own (``name``), ``consumer`` on them: yields the queues' settings and a
    publishing channel."""
    async with own_queues(settings, name) as mine:
        connection = await aio_pika.connect(mine.amqp.url)
        try:
            publishing = await connection.channel()
            await declare_topology(publishing, mine.amqp)
            async with consuming(mine.amqp, consumer, prefetch=16):
                yield mine, publishing
        finally:
            await connection.close()


async def test_a_connection_the_broker_closes_is_consumed_again(settings, engine, store, put_product, product_id):
    await put_product(product_id, stock=60, limit=1)
    first = [message_for(product_id, f"a{i}", 740_000 + i) for i in range(30)]
    after = [message_for(product_id, f"b{i}", 741_000 + i) for i in range(30)]
    consumer = OrderConsumer(engine, store)
    async with _consumed(settings, "reconnect", consumer) as (mine, publishing):
        await _publish(publishing, mine, first)
        await eventually(lambda: rows_are(engine, product_id, 30))
        closed = await eventually(lambda: _connections_consuming(mine.amqp.queue))
        for pid in closed:
            await _ctl("close_connection", pid, "closed by test_subscription")
        await _publish(publishing, mine, after)
        await eventually(lambda: rows_are(engine, product_id, 60), timeout=60)
        reconnected = await eventually(lambda: _connections_consuming(mine.amqp.queue))
        left = await queue_depth(publishing, mine.amqp.queue)
    assert set(reconnected).isdisjoint(closed)
    rows = await order_rows(engine, product_id)
    assert len({row.request_id for row in rows}) == 60 and all(row.status == 0 for row in rows)
    assert await inventory(engine, product_id) == (0, 60)
    assert consumer.counts.get("applied") == 60
    assert left == 0


async def test_an_order_queue_deleted_under_the_consumer_comes_back_and_is_consumed(
    settings, engine, store, put_product, product_id
):
    await put_product(product_id, stock=40, limit=1)
    first = [message_for(product_id, f"c{i}", 742_000 + i) for i in range(20)]
    after = [message_for(product_id, f"d{i}", 743_000 + i) for i in range(20)]
    consumer = OrderConsumer(engine, store)
    async with _consumed(settings, "deleted", consumer) as (mine, publishing):
        await _publish(publishing, mine, first)
        await eventually(lambda: rows_are(engine, product_id, 20))
        await _ctl("delete_queue", mine.amqp.queue)
        # Declared and bound again by the consumer's reopened channel, and consumed again.
        await eventually(lambda: _connections_consuming(mine.amqp.queue), timeout=60)
        await _publish(publishing, mine, after)
        await eventually(lambda: rows_are(engine, product_id, 40), timeout=60)
    assert await inventory(engine, product_id) == (0, 40)
    assert consumer.counts.get("applied") == 40
