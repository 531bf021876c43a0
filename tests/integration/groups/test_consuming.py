"""The consumer takes a group as it takes a batch (docs/ARCHITECTURE.md, "Order messages and
groups"), on the real RabbitMQ, Redis and MariaDB: duplicates found per order, exact sold-out
rejections inside a group, a poison order dead-lettered alone while the others commit, a group
redelivered after its consumer was killed mid-transaction written once, and messages of the
single-order format read beside groups (a rolling upgrade)."""

from __future__ import annotations

import asyncio
import os
import signal
from collections import Counter

import msgspec
from sqlalchemy import text

from consumers.consume import consuming
from consumers.order_consumer import OrderConsumer
from db.models import OrderStatus
from service.adapters.broker_topology import queue_depth
from service.adapters.retry_routing import REASON
from service.model.order_message import OrderMessage, decode_order, encode_order
from tests.integration.groups.conftest import group_body, take_all
from tests.support import (
    PATIENCE,
    eventually,
    inventory,
    message_for,
    order_rows,
    publish_raw,
    rows_are,
    start_flashsale,
)
from toolkit.sale.isolation import environment


async def _consume_until(own, engine, store, product_id: int, rows: int) -> OrderConsumer:
    """Run a consumer on ``own``'s queues until ``product_id`` has ``rows`` order rows (and what
    it holds is settled)."""
    consumer = OrderConsumer(engine, store)
    async with consuming(own.amqp, consumer, prefetch=16):
        await eventually(lambda: rows_are(engine, product_id, rows))
    return consumer


async def test_a_group_with_a_duplicate_and_its_redelivery_write_each_order_once(
    own, channel, put_product, product_id, engine, store
):
    await put_product(product_id, stock=10, limit=1)
    orders = [message_for(product_id, f"dup{i}", 810_000 + i) for i in range(3)]
    body = group_body([*orders, orders[0]])  # the first order twice in one group
    await publish_raw(channel, own, body, "g1")
    await publish_raw(channel, own, body, "g1")  # and the whole group again (a redelivery)
    consumer = await _consume_until(own, engine, store, product_id, 3)
    await asyncio.sleep(0.3)  # nothing more lands late
    assert len(await order_rows(engine, product_id)) == 3
    assert await inventory(engine, product_id) == (7, 3)
    assert consumer.counts.get("applied") == 3 and consumer.counts.get("duplicate") == 5


async def test_a_group_crossing_the_last_unit_rejects_exactly_what_does_not_fit(
    own, channel, put_product, product_id, engine, store
):
    await put_product(product_id, stock=5, limit=1)
    orders = [message_for(product_id, f"last{i}", 820_000 + i) for i in range(8)]
    await publish_raw(channel, own, group_body(orders), "g2")
    consumer = await _consume_until(own, engine, store, product_id, 8)
    rows = {row.order_no: row for row in await order_rows(engine, product_id)}
    # In delivery order: the first five take the last units, the three behind them are sold out.
    assert [rows[order.order_no].status for order in orders] == [OrderStatus.PENDING_PAYMENT] * 5 + [
        OrderStatus.REJECTED
    ] * 3
    assert Counter(row.reason for row in rows.values() if row.status == OrderStatus.REJECTED) == {"sold_out": 3}
    assert await inventory(engine, product_id) == (0, 5)
    assert consumer.counts.get("applied") == 5 and consumer.counts.get("rejected") == 3


async def test_a_poison_order_in_a_group_is_dead_lettered_alone_while_the_rest_commit(
    own, channel, put_product, product_id, new_product_id, engine, store
):
    await put_product(product_id, stock=10, limit=1)
    good = [message_for(product_id, f"good{i}", 830_000 + i) for i in range(4)]
    ghost = message_for(new_product_id(), "ghost", 830_100)  # a product that does not exist
    bad = OrderMessage("f" * 32, good[0].order_no[:-1] + "0", "not a user!", product_id, 1, 0, 1500)  # out of domain
    await publish_raw(channel, own, group_body([good[0], ghost, good[1], bad, good[2], good[3]]), "g3")
    consumer = OrderConsumer(engine, store)
    async with consuming(own.amqp, consumer, prefetch=16):
        await eventually(lambda: rows_are(engine, product_id, 4))
        await eventually(lambda: _depth_is(channel, own.amqp.dead_letter_queue, 2))
    assert await inventory(engine, product_id) == (6, 4)
    dead = {message.message_id: message for message in await take_all(channel, own.amqp.dead_letter_queue)}
    # Each alone, in the single-order format, under its own request id, with its own reason.
    assert set(dead) == {ghost.request_id, bad.request_id}
    assert decode_order(dead[ghost.request_id].body) == ghost
    assert dead[ghost.request_id].headers[REASON] == "unknown_product"
    assert decode_order(dead[bad.request_id].body) == bad
    assert dead[bad.request_id].headers[REASON] == "invalid_order"
    assert await queue_depth(channel, own.amqp.queue) == 0  # the group itself was acked
    assert consumer.counts.get("dead_lettered") == 2 and consumer.counts.get("applied") == 4


async def test_a_malformed_order_in_a_group_is_dead_lettered_alone_and_its_neighbours_are_written(
    own, channel, put_product, product_id, engine, store
):
    """Orders of a group that do not decode (a quantity of the wrong type; no request id) are
    dead-lettered alone, as their own JSON; the 15 valid orders around them are written."""
    await put_product(product_id, stock=20, limit=1)
    good = [message_for(product_id, f"fine{i}", 835_000 + i) for i in range(15)]
    wrong_type = {**msgspec.to_builtins(message_for(product_id, "wrongtype", 835_100)), "quantity": "two"}
    nameless = msgspec.to_builtins(message_for(product_id, "nameless", 835_101))
    del nameless["request_id"]
    orders = [*msgspec.to_builtins(good[:7]), wrong_type, *msgspec.to_builtins(good[7:]), nameless]
    body = msgspec.json.encode({"v": 1, "id": "m" * 32, "orders": orders})
    await publish_raw(channel, own, body, "m" * 32)
    consumer = OrderConsumer(engine, store)
    async with consuming(own.amqp, consumer, prefetch=16):
        await eventually(lambda: rows_are(engine, product_id, 15))
        await eventually(lambda: _depth_is(channel, own.amqp.dead_letter_queue, 2))
    assert {row.request_id for row in await order_rows(engine, product_id)} == {order.request_id for order in good}
    assert await inventory(engine, product_id) == (5, 15)
    dead = {message.message_id: message for message in await take_all(channel, own.amqp.dead_letter_queue)}
    assert set(dead) == {wrong_type["request_id"], f"{'m' * 32}.16"}  # its own id, or the group's and position
    assert msgspec.json.decode(dead[wrong_type["request_id"]].body) == wrong_type
    assert msgspec.json.decode(dead[f"{'m' * 32}.16"].body) == nameless
    assert {message.headers[REASON] for message in dead.values()} == {"invalid_order"}
    assert await queue_depth(channel, own.amqp.queue) == 0
    assert consumer.counts.get("applied") == 15 and consumer.counts.get("dead_lettered") == 2


async def _depth_is(channel, queue: str, count: int) -> bool:
    return await queue_depth(channel, queue) == count


async def test_single_order_messages_and_groups_are_read_side_by_side(
    own, channel, put_product, product_id, engine, store
):
    await put_product(product_id, stock=100, limit=1)
    orders = [message_for(product_id, f"mixed{i}", 840_000 + i) for i in range(40)]
    for index in range(0, 40, 10):  # in turn: five old-format messages, then a group of five
        for order in orders[index : index + 5]:
            await publish_raw(channel, own, encode_order(order), order.request_id)
        await publish_raw(channel, own, group_body(orders[index + 5 : index + 10], f"mixed-{index}"), f"mixed-{index}")
    consumer = await _consume_until(own, engine, store, product_id, 40)
    assert {row.order_no for row in await order_rows(engine, product_id)} == {order.order_no for order in orders}
    assert await inventory(engine, product_id) == (60, 40)
    assert consumer.counts.get("applied") == 40


async def test_a_group_redelivered_after_its_consumer_was_killed_mid_transaction_is_written_once(
    own, channel, put_product, product_id, engine, store
):
    """The consumer process is killed (SIGKILL) while its transaction waits for the inventory row
    lock another transaction holds, the group's order rows inserted but not committed; the group
    comes back to the next consumer, which writes every order once."""
    await put_product(product_id, stock=50, limit=1)
    orders = [message_for(product_id, f"killed{i}", 850_000 + i) for i in range(20)]
    await publish_raw(channel, own, group_body(orders, "killed"), "killed")
    holding, release = asyncio.Event(), asyncio.Event()

    async def hold_row_lock() -> None:
        async with engine.begin() as conn:
            await conn.execute(text("SELECT stock FROM inventory WHERE product_id = :p FOR UPDATE"), {"p": product_id})
            holding.set()
            await release.wait()

    blocker = asyncio.create_task(hold_row_lock())
    await holding.wait()
    process = start_flashsale(["consume", "--prefetch", "8"], {**os.environ, **environment(own)})
    try:
        await eventually(lambda: _waits_for_a_row_lock(engine), timeout=PATIENCE)
        process.send_signal(signal.SIGKILL)
        await asyncio.to_thread(process.wait, PATIENCE)
    finally:
        if process.poll() is None:
            process.kill()
        release.set()
        await blocker
    assert await order_rows(engine, product_id) == []  # its transaction died with it
    consumer = await _consume_until(own, engine, store, product_id, 20)
    await asyncio.sleep(0.3)
    assert len(await order_rows(engine, product_id)) == 20
    assert await inventory(engine, product_id) == (30, 20)
    assert consumer.counts.get("applied") == 20


async def _waits_for_a_row_lock(engine) -> bool:
    """A session of this test's database waits in the inventory update (the consumer's, its
    order rows inserted before it; innodb_trx is not used: MariaDB's view of it lags)."""
    query = text(
        "SELECT COUNT(*) FROM information_schema.processlist WHERE db = DATABASE() AND info LIKE 'UPDATE inventory%'"
    )
    async with engine.connect() as conn:
        return bool((await conn.execute(query)).scalar())
