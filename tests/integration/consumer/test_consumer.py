"""The consumer's authoritative write, on the real queue and database."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import aio_pika
import pytest
from sqlalchemy import text

from service.adapters.broker_topology import queue_depth
from service.adapters.redis.stores import open_stores
from service.domain.fulfilment.order_writer import Outcome, apply_order
from service.model.order_message import OrderMessage, encode_order
from tests.support import (
    PATIENCE,
    behind_a_row_lock,
    eventually,
    inventory,
    message_for,
    order_rows,
    own_queues,
    publish_raw,
    running_consumer,
)
from toolkit.sale.isolation import environment


async def reserved_message(client, token, redis, settings, product_id, user) -> OrderMessage:
    """Buy through the API, then rebuild the message it published from the journal."""
    response = await client.post("/api/v1/orders", json={"product_id": product_id, "quantity": 1}, headers=token(user))
    assert response.status_code == 202
    body = response.json()
    journal = await open_stores(redis, settings.redis.key_prefix).stock.journal(product_id)
    reserved_at = next(entry.reserved_at_ms for entry in journal if entry.request_id == body["request_id"])
    return OrderMessage(body["request_id"], body["order_no"], user, product_id, 1, reserved_at, 1500)


async def test_message_delivered_twice_gives_one_order_and_one_decrement(
    client, token, put_product, product_id, redis, settings, engine, amqp_channel, consumer
):
    await put_product(product_id, stock=5, limit=1)
    message = await reserved_message(client, token, redis, settings, product_id, "twice")
    await publish_raw(amqp_channel, settings, encode_order(message), message.request_id)

    async def both_handled():
        return consumer.counts.get("applied", 0) >= 1 and consumer.counts.get("duplicate", 0) >= 1

    await eventually(both_handled)
    rows = await order_rows(engine, product_id)
    assert [row.order_no for row in rows] == [message.order_no]
    assert await inventory(engine, product_id) == (4, 1)


async def test_apply_order_is_idempotent_on_request_id(engine, put_product, product_id):
    await put_product(product_id, stock=3, limit=1)
    message = message_for(product_id, "direct", 1)
    assert await apply_order(engine, message) is Outcome.APPLIED
    assert await apply_order(engine, message) is Outcome.DUPLICATE
    assert await inventory(engine, product_id) == (2, 1)


async def test_no_mysql_stock_records_rejected_sold_out_and_realign_returns_quota(
    client, token, put_product, product_id, redis, settings, engine, consumer, store
):
    await put_product(product_id, stock=5, limit=1)
    async with engine.begin() as conn:  # MySQL has nothing left, Redis still thinks it has 5
        await conn.execute(text("UPDATE inventory SET stock = 0 WHERE product_id = :p"), {"p": product_id})
    body = {"product_id": product_id, "quantity": 1}
    response = await client.post("/api/v1/orders", json=body, headers=token("late"))
    assert response.status_code == 202

    rows = await eventually(lambda: order_rows(engine, product_id))
    assert [(row.status, row.reason) for row in rows] == [(7, "sold_out")]
    assert await inventory(engine, product_id) == (0, 0)
    async with engine.connect() as conn:
        log = list(
            await conn.execute(
                text(
                    "SELECT l.from_status, l.to_status, l.reason FROM order_status_log l"
                    " JOIN orders o ON o.id = l.order_id"
                    " WHERE o.product_id = :p ORDER BY l.id"
                ),
                {"p": product_id},
            )
        )
    assert [tuple(r) for r in log] == [(None, 0, None), (0, 7, "sold_out")]

    order = await client.get(f"/api/v1/orders/{response.json()['order_no']}", headers=token("late"))
    assert order.json()["status"] == "rejected" and order.json()["reason"] == "sold_out"

    realigned = await client.post(f"/api/v1/admin/realign?product_id={product_id}", headers=token("a", admin=True))
    report = realigned.json()[0]
    assert report["redis_stock_after"] == 0 and report["resolved_dropped"] == 1
    keys = store.product_keys(product_id)
    assert await redis.hgetall(keys.quota) == {}
    assert await redis.hgetall(keys.journal) == {}


async def test_undecodable_message_is_dead_lettered_and_does_not_block(
    put_product, product_id, settings, amqp_channel, engine, consumer
):
    await put_product(product_id, stock=5, limit=1)
    dead_before = await queue_depth(amqp_channel, settings.amqp.dead_letter_queue)
    await publish_raw(amqp_channel, settings, b"\x00garbage")
    await publish_raw(amqp_channel, settings, b'{"request_id": "nothex", "order_no": "x"}')
    good = message_for(product_id, "after-garbage", 2)
    await publish_raw(amqp_channel, settings, encode_order(good))

    await eventually(lambda: order_rows(engine, product_id))
    await eventually(lambda: _depth_is(amqp_channel, settings.amqp.dead_letter_queue, dead_before + 2))
    assert consumer.counts.get("invalid", 0) >= 2


async def _depth_is(channel, queue, expected):
    return await queue_depth(channel, queue) == expected


async def test_unknown_product_is_dead_lettered_at_once_with_its_reason(new_product_id, settings, engine, store):
    ghost = message_for(new_product_id(), "ghost", 3)
    async with own_queues(settings, "ghost") as mine, running_consumer(mine, engine, store) as consumer:
        connection = await aio_pika.connect(mine.amqp.url)
        try:
            channel = await connection.channel()
            await publish_raw(channel, mine, encode_order(ghost), ghost.request_id)
            await eventually(lambda: _depth_is(channel, mine.amqp.dead_letter_queue, 1))
            dead = await (await channel.get_queue(mine.amqp.dead_letter_queue)).get(timeout=10)
            await dead.ack()
        finally:
            await connection.close()
    # A permanent failure: one delivery, no retry, no redelivery spent.
    assert consumer.counts.get("unknown_product", 0) == 1
    assert consumer.counts.get("retried", 0) == 0
    assert dead.message_id == ghost.request_id and dead.body == encode_order(ghost)
    assert dead.headers["x-flashsale-reason"] == "unknown_product"
    assert dead.headers["x-flashsale-deaths"] == 1


async def test_lock_wait_timeout_retries_the_whole_transaction(settings, engine, put_product, product_id):
    await put_product(product_id, stock=3, limit=1)
    outcome, timeouts = await behind_a_row_lock(
        settings, engine, product_id, lambda impatient: apply_order(impatient, message_for(product_id, "waiter", 4))
    )
    assert outcome is Outcome.APPLIED and timeouts >= 1  # the first attempt hit 1205, a retry wrote it
    assert await inventory(engine, product_id) == (2, 1)
    assert len(await order_rows(engine, product_id)) == 1


@pytest.mark.slow
async def test_sigterm_finishes_messages_in_hand_and_exits_0(settings, put_product, product_id, amqp_channel, engine):
    await put_product(product_id, stock=500, limit=1)
    for i in range(200):
        await publish_raw(amqp_channel, settings, encode_order(message_for(product_id, f"sig{i}", 1000 + i)))
    flashsale = Path(sys.executable).with_name("flashsale")
    process = subprocess.Popen(
        [str(flashsale), "consume", "--prefetch", "50"],
        env={**os.environ, **environment(settings)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        await eventually(lambda: _some_rows(engine, product_id), interval=0.01)
        process.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(process.wait, PATIENCE)
    finally:
        if process.poll() is None:
            process.kill()
    assert code == 0, process.stderr.read().decode()[-2000:]
    applied = len(await order_rows(engine, product_id))
    left = await queue_depth(amqp_channel, settings.amqp.queue)
    # Nothing lost, nothing half-done: every message is either applied (and acked) or back in the queue.
    assert applied + left == 200
    assert await inventory(engine, product_id) == (500 - applied, applied)


async def _some_rows(engine, product_id):
    return len(await order_rows(engine, product_id)) > 0
