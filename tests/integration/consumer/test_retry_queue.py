"""Retries that do not hold the prefetch window (docs/ARCHITECTURE.md), on the real RabbitMQ, Redis and
MariaDB: a permanent failure is dead-lettered at once with its reason, a transient one waits in a
retry queue (TTL, then back to the order queue) instead of in the consumer's hands, and a MySQL
outage never spends the delivery limit meant for poison."""

from __future__ import annotations

import asyncio
import time

import aio_pika
import pytest
from sqlalchemy import text

from consumers.consume import consuming
from consumers.order_consumer import OrderConsumer
from db.engine import make_engine
from db.migrate import upgrade
from service.adapters.broker_topology import queue_depth
from service.adapters.retry_routing import RETRIES
from service.model.order_message import encode_order
from tests.servers import PrivateMariaDB, private_server, scratch
from tests.support import (
    eventually,
    inventory,
    message_for,
    order_rows,
    own_queues,
    publish_raw,
    rows_are,
)

PREFETCH = 64  # the prefetch of the fault suite's run (docs/RELIABILITY.md): fewer than the poison messages


async def _depth(channel, queue: str) -> int:
    return await queue_depth(channel, queue)


async def test_a_poison_flood_does_not_hold_up_real_orders(
    settings, engine, store, put_product, product_id, new_product_id
):
    await put_product(product_id, stock=100, limit=1)
    ghost_product = new_product_id()  # never created: every one of its orders is poison
    poison = [message_for(ghost_product, f"ghost{i}", 700_000 + i) for i in range(100)]
    real = [message_for(product_id, f"real{i}", 710_000 + i) for i in range(50)]
    consumer = OrderConsumer(engine, store)
    async with own_queues(settings, "flood") as mine:
        connection = await aio_pika.connect(mine.amqp.url)
        try:
            channel = await connection.channel()
            async with consuming(mine.amqp, consumer, prefetch=PREFETCH):
                started = time.monotonic()
                for message in poison:  # the whole prefetch window and more is poison
                    await publish_raw(channel, mine, encode_order(message), message.request_id)
                await asyncio.gather(
                    *(publish_raw(channel, mine, encode_order(message), message.request_id) for message in real)
                )
                await eventually(lambda: rows_are(engine, product_id, len(real)), interval=0.01)
                landed = time.monotonic() - started
                await eventually(lambda: _is(channel, mine.amqp.dead_letter_queue, len(poison)))
            retry_depths = [await _depth(channel, queue) for queue in mine.amqp.retry_queues()]
        finally:
            await connection.close()
    print(f"\n100 poison + 50 real orders, prefetch {PREFETCH}: real ones written {landed:.2f} s after the first")
    # Each poison message was delivered once and dead-lettered at once: none waited out a
    # back-off in the window, none came back, nothing sits in a retry queue.
    assert consumer.counts.get("unknown_product") == len(poison)
    assert consumer.counts.get("dead_lettered") == len(poison)
    assert consumer.counts.get("retried", 0) == 0
    assert retry_depths == [0] * len(retry_depths)
    assert consumer.counts.get("applied") == len(real)
    assert await inventory(engine, product_id) == (50, 50)


@pytest.mark.slow  # starts a MariaDB server of its own
async def test_mariadb_down_longer_than_the_delivery_limit_window_dead_letters_nothing(settings, store):
    delivery_limit = settings.amqp.delivery_limit
    # Before: back-off 1, 2, 4 ... s inside the window, dead-lettered past the delivery limit
    # (2 in the tests): ~7 s. The outage lasts twice that.
    outage_seconds = 2 * sum(2.0**n for n in range(delivery_limit + 1))
    async with private_server(PrivateMariaDB(scratch("mariadb"))) as mariadb:
        assert isinstance(mariadb, PrivateMariaDB)
        await upgrade(mariadb.url())
        engine = make_engine(mariadb.url(), pool_size=5, max_overflow=5)
        product_id = 1
        async with engine.begin() as conn:
            await conn.execute(
                text(
                    "INSERT INTO products (id, name, price, per_user_limit, sale_starts_at, stock_mode)"
                    " VALUES (:p, 'outage', 1500, 1, '2000-01-01', 'redis')"
                ),
                {"p": product_id},
            )
            await conn.execute(text("INSERT INTO inventory (product_id, stock) VALUES (:p, 1000)"), {"p": product_id})
        before = [message_for(product_id, f"before{i}", 720_000 + i) for i in range(20)]
        during = [message_for(product_id, f"during{i}", 721_000 + i) for i in range(150)]
        async with own_queues(settings, "outage", retry_delays=[0.5, 1.0, 2.0]) as mine:
            consumer = OrderConsumer(engine, store)
            connection = await aio_pika.connect(mine.amqp.url)
            try:
                channel = await connection.channel()
                async with consuming(mine.amqp, consumer, prefetch=PREFETCH):
                    for message in before:
                        await publish_raw(channel, mine, encode_order(message), message.request_id)
                    await eventually(lambda: rows_are(engine, product_id, len(before)))

                    await mariadb.kill()  # MariaDB dies with orders on their way
                    down_at = time.monotonic()
                    for message in during:
                        await publish_raw(channel, mine, encode_order(message), message.request_id)
                    await asyncio.sleep(outage_seconds)
                    assert await _depth(channel, mine.amqp.dead_letter_queue) == 0
                    await mariadb.start()
                    up_at = time.monotonic()

                    await eventually(lambda: rows_are(engine, product_id, len(before) + len(during)))
                    landed = time.monotonic() - up_at
                dead = await _depth(channel, mine.amqp.dead_letter_queue)
                waiting = [await _depth(channel, queue) for queue in mine.amqp.retry_queues()]
            finally:
                await connection.close()
        print(
            f"\nMariaDB down {up_at - down_at:.1f} s (old delivery-limit window ~{outage_seconds / 2:.0f} s):"
            f" {len(during)} orders, {consumer.counts.get('retried', 0)} trips through the retry queues,"
            f" all written {landed:.2f} s after it came back"
        )
        rows = await order_rows(engine, product_id)
        await engine.dispose()
    assert dead == 0  # no good order dead-lettered
    assert waiting == [0] * len(waiting)
    assert len(rows) == len(before) + len(during) and {row.status for row in rows} == {0}
    # Each order came back through the retry queues more often than the delivery limit allows
    # redeliveries: the outage did not spend it.
    assert consumer.counts.get("retried", 0) > len(during) * (delivery_limit + 1)


async def test_a_retried_delivery_carries_its_count_and_comes_back(settings, engine, store, put_product, product_id):
    """A transient failure (here: the batch transaction cannot get a connection) sends the
    delivery to the retry queue with its retry count; it comes back to the order queue by itself
    and is written once the failure is gone."""
    await put_product(product_id, stock=5, limit=1)
    order = message_for(product_id, "patient", 730_000)
    broken = make_engine("mysql+asyncmy://root@127.0.0.1:1/nothing", pool_size=1, max_overflow=0)
    async with own_queues(settings, "retried", retry_delays=[0.2, 0.4]) as mine:
        connection = await aio_pika.connect(mine.amqp.url)
        try:
            channel = await connection.channel()
            failing = OrderConsumer(broken, store)
            async with consuming(mine.amqp, failing, prefetch=8):
                await publish_raw(channel, mine, encode_order(order), order.request_id)
                await eventually(lambda: asyncio.sleep(0, failing.counts.get("retried", 0) >= 3))
            assert failing.counts.get("failed", 0) >= 3 and failing.counts.get("dead_lettered", 0) == 0

            async def back_in_the_order_queue():
                return await (await channel.get_queue(mine.amqp.queue)).get(no_ack=False, fail=False)

            returned = await eventually(back_in_the_order_queue)
            assert returned.message_id == order.request_id and returned.headers[RETRIES] >= 3
            await returned.nack(requeue=True)

            healthy = OrderConsumer(engine, store)
            async with consuming(mine.amqp, healthy, prefetch=8):
                await eventually(lambda: rows_are(engine, product_id, 1))
            assert await _depth(channel, mine.amqp.dead_letter_queue) == 0
        finally:
            await connection.close()
            await broken.dispose()
    assert await inventory(engine, product_id) == (4, 1)


async def _is(channel, queue, expected):
    return await queue_depth(channel, queue) == expected
