"""Partitioned order queues (docs/ARCHITECTURE.md) on the real RabbitMQ, Redis and MariaDB, with
``FLASHSALE_AMQP__PARTITIONS=3``: a product's orders always land in its own partition's queue,
consumers take any subset of the partitions (and leave the others' messages alone), a retried
order comes back to the partition it came from, and the one dead-letter queue serves every
partition, ``flashsale dlq redrive`` sending each order back to its product's partition. Each
test has queues of its own (``own_queues``), deleted with their retry queues afterwards."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import aio_pika
import pytest

from consumers.consume import consuming
from consumers.order_consumer import OrderConsumer
from db.engine import make_engine
from service.adapters.broker_topology import declare_topology, queue_depth
from service.adapters.dead_letters import DeadLetterQueue
from service.bootstrap import open_api
from service.domain.purchase.request_id import mint_request_id
from service.model.order_message import OrderMessage, decode_order, encode_order, orders_of
from service.settings import AMQPSettings, Settings
from tests.support import (
    PATIENCE,
    eventually,
    inventory,
    message_for,
    order_rows,
    own_queues,
    publish_raw,
    rows_are,
    start_flashsale,
)
from toolkit.sale.isolation import environment, free_port

PARTITIONS = 3
POISON = b"\x00not an order"
_sequences = itertools.count(950_000)  # order-number sequences no other test uses
_OUTCOMES = ("applied", "rejected", "duplicate")


def _order(product_id: int, user: str) -> OrderMessage:
    return message_for(product_id, user, next(_sequences))


def _one_per_partition(new_product_id, amqp: AMQPSettings) -> list[int]:
    """New product ids, the i-th in partition i."""
    found: dict[int, int] = {}
    while len(found) < amqp.partitions:
        product_id = new_product_id()
        found.setdefault(amqp.partition_of(product_id), product_id)
    return [found[partition] for partition in range(amqp.partitions)]


async def _depths(channel, amqp: AMQPSettings) -> list[int]:
    """Messages ready in each partition's order queue, partition 0 first."""
    return [await queue_depth(channel, queue) for queue in amqp.partition_queues()]


async def _publish(channel, own: Settings, orders: list[OrderMessage]) -> None:
    """Each order to its product's partition, side by side."""
    await asyncio.gather(
        *(
            publish_raw(channel, own, encode_order(order), order.request_id, own.amqp.partition_of(order.product_id))
            for order in orders
        )
    )


async def _take_all(channel, name: str) -> list[aio_pika.abc.AbstractIncomingMessage]:
    """Every message ready in queue ``name``, taken unacked (back in the queue when the channel closes)."""
    queue = await channel.declare_queue(name, passive=True)
    messages = []
    while (message := await queue.get(no_ack=False, fail=False)) is not None:
        messages.append(message)
    return messages


def _outcomes(*consumers: OrderConsumer) -> dict[str, int]:
    return {what: sum(consumer.counts.get(what, 0) for consumer in consumers) for what in _OUTCOMES}


@pytest.fixture
async def parted(settings, request):
    """(settings with 3 partitions and queues of their own, a channel with the topology declared)."""
    name = "p3-" + request.node.name[5:35]
    async with own_queues(settings, name, partitions=PARTITIONS, retry_delays=[0.2]) as own:
        connection = await aio_pika.connect(own.amqp.url)
        try:
            channel = await connection.channel()
            await declare_topology(channel, own.amqp)
            yield own, channel
        finally:
            await connection.close()


async def test_each_products_orders_land_in_its_own_partition(parted, put_product, new_product_id):
    own, channel = parted
    products = _one_per_partition(new_product_id, own.amqp)
    wanted = {product: 3 + 2 * partition for partition, product in enumerate(products)}  # 3, 5, 7: a mix-up shows
    for product in products:
        await put_product(product, stock=20, limit=1)
    resources = await open_api(own)
    try:  # the real purchase path: reserve in Redis, publish with confirm
        accepted = await asyncio.gather(
            *(
                resources.purchases.purchase(f"lands-{product}-{i}", product, 1, mint_request_id())
                for product, count in wanted.items()
                for i in range(count)
            )
        )
    finally:
        await resources.close()

    landed = []  # orders per partition (the orders of one partition may share messages: groups)
    for partition, name in enumerate(own.amqp.partition_queues()):
        messages = await _take_all(channel, name)
        orders = [order for message in messages for order in orders_of(message.body)]
        assert {order.product_id for order in orders} == {products[partition]}
        landed.append(len(orders))
        # the routing key names the partition's queue: what a retry is routed back by
        assert {message.routing_key for message in messages} == {name}
    assert landed == [3, 5, 7]
    assert len({order.request_id for order in accepted}) == sum(wanted.values())


async def test_consumers_on_different_partitions_write_every_order_exactly_once(
    parted, engine, store, put_product, new_product_id
):
    own, channel = parted
    products = _one_per_partition(new_product_id, own.amqp)
    stock, demand, repeated = 150, 200, 40
    for product in products:
        await put_product(product, stock=stock, limit=1)
    orders = [_order(product, f"many-{product}-{i}") for product in products for i in range(demand)]
    copies = [order for product in products for order in [o for o in orders if o.product_id == product][:repeated]]
    only_0, one_and_two, only_2 = (OrderConsumer(engine, store, batch_size=50) for _ in range(3))
    async with (
        consuming(own.amqp, only_0, prefetch=64, partitions=[0]),
        consuming(own.amqp, one_and_two, prefetch=64, partitions=[1, 2]),
        consuming(own.amqp, only_2, prefetch=64, partitions=[2]),  # competes with one_and_two on 2
    ):
        everything = orders + copies
        for start in range(0, len(everything), 300):  # published while all three consume
            await _publish(channel, own, everything[start : start + 300])

        async def all_handled() -> bool:
            return sum(_outcomes(only_0, one_and_two, only_2).values()) == len(everything)

        await eventually(all_handled)
    for product in products:
        rows = await order_rows(engine, product)
        assert len(rows) == len({row.request_id for row in rows}) == len({row.order_no for row in rows}) == demand
        assert sum(row.status == 0 for row in rows) == stock
        assert await inventory(engine, product) == (0, stock)
    one_partition = {"applied": stock, "rejected": demand - stock, "duplicate": repeated}
    assert _outcomes(only_0) == one_partition  # partition 0's orders, all of them, and nothing else
    assert _outcomes(one_and_two, only_2) == {what: 2 * count for what, count in one_partition.items()}
    assert await _depths(channel, own.amqp) == [0, 0, 0]


async def test_a_consumer_of_partition_0_leaves_the_other_partitions_alone(
    parted, engine, store, put_product, new_product_id
):
    own, channel = parted
    products = _one_per_partition(new_product_id, own.amqp)
    for product in products:
        await put_product(product, stock=10, limit=1)
    orders = [
        _order(product, f"alone-{product}-{i}")
        for partition, product in enumerate(products)
        for i in range(4 + partition)
    ]
    await _publish(channel, own, orders)
    await eventually(lambda: _depths_are(channel, own.amqp, [4, 5, 6]))

    process = start_flashsale(
        ["consume", "--partitions", "0", "--metrics-port", "0"], {**os.environ, **environment(own)}
    )
    try:
        await eventually(lambda: rows_are(engine, products[0], 4))
        await eventually(lambda: _depths_are(channel, own.amqp, [0, 5, 6]))
        await asyncio.sleep(1.0)  # time enough to take (wrongly) what it was not given
        assert await _depths(channel, own.amqp) == [0, 5, 6]
        assert await order_rows(engine, products[1]) == await order_rows(engine, products[2]) == []
        os.killpg(process.pid, signal.SIGTERM)
        assert await asyncio.to_thread(process.wait, PATIENCE) == 0
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)

    rest = OrderConsumer(engine, store)
    async with consuming(own.amqp, rest, prefetch=16, partitions=[1, 2]):
        await eventually(lambda: rows_are(engine, products[2], 6))
        await eventually(lambda: rows_are(engine, products[1], 5))
    assert _outcomes(rest) == {"applied": 11, "rejected": 0, "duplicate": 0}
    assert await _depths(channel, own.amqp) == [0, 0, 0]


def test_consume_refuses_a_partition_that_does_not_exist(settings):
    own = settings.model_copy(update={"amqp": settings.amqp.model_copy(update={"partitions": PARTITIONS})})
    flashsale = str(Path(sys.executable).with_name("flashsale"))
    env = {**os.environ, **environment(own)}
    for wrong in ("3", "0,x", ","):
        done = subprocess.run(
            [flashsale, "consume", "--partitions", wrong], env=env, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 2, done.stderr
        assert "--partitions" in done.stderr


async def test_a_retried_order_comes_back_to_its_own_partition(parted, engine, store, put_product, new_product_id):
    own, channel = parted
    products = _one_per_partition(new_product_id, own.amqp)
    await put_product(products[1], stock=5, limit=1)
    order = _order(products[1], "retried")
    # MySQL unreachable for this consumer (nothing listens there): a transient failure, retried
    unreachable = make_engine(f"mysql+asyncmy://root@127.0.0.1:{free_port()}/nowhere", pool_size=1, max_overflow=0)
    broken = OrderConsumer(unreachable, store)
    try:
        async with consuming(own.amqp, broken, prefetch=8, partitions=[1]):
            await _publish(channel, own, [order])

            async def retried_thrice() -> bool:
                return broken.counts.get("retried", 0) >= 3

            # three times through partition 1's retry queue, and back each time to partition 1,
            # the only queue this consumer takes
            await eventually(retried_thrice)
    finally:
        await unreachable.dispose()
    others = [0, 2]
    assert [await queue_depth(channel, own.amqp.partition_queue(p)) for p in others] == [0, 0]
    assert [await queue_depth(channel, q) for p in others for q in own.amqp.retry_queues(p)] == [0, 0]

    async def back_in_partition_1() -> bool:
        return await _depths(channel, own.amqp) == [0, 1, 0]

    await eventually(back_in_partition_1)
    healthy = OrderConsumer(engine, store)
    async with consuming(own.amqp, healthy, prefetch=8, partitions=[1]):
        await eventually(lambda: rows_are(engine, products[1], 1))
    assert healthy.counts.get("applied") == 1
    assert await inventory(engine, products[1]) == (4, 1)


async def test_dead_letters_of_every_partition_share_one_queue_and_redrive_to_their_own_partition(
    parted, engine, store, new_product_id
):
    own, channel = parted
    ghosts = _one_per_partition(new_product_id, own.amqp)  # never created: every order is unknown_product
    orders = [
        _order(ghost, f"ghost-{ghost}-{i}") for partition, ghost in enumerate(ghosts) for i in range(partition + 1)
    ]
    consumer = OrderConsumer(engine, store)
    async with consuming(own.amqp, consumer, prefetch=16):  # every partition
        await _publish(channel, own, orders)
        await publish_raw(channel, own, POISON, "poison-p2", partition=2)
        await eventually(lambda: _dead_are(channel, own, 7))
    assert consumer.counts.get("unknown_product") == 6 and consumer.counts.get("invalid") == 1

    flashsale = str(Path(sys.executable).with_name("flashsale"))
    env = {**os.environ, **environment(own)}

    def dlq(*args: str) -> list[dict]:
        done = subprocess.run([flashsale, "dlq", *args, "--json"], env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    listed = await asyncio.to_thread(dlq, "list")
    died_in = {entry["id"]: entry["queue"] for entry in listed}
    expected = {order.request_id: own.amqp.queue_of(order.product_id) for order in orders}
    assert died_in == expected | {"poison-p2": own.amqp.partition_queue(2)}
    assert len(set(died_in.values())) == PARTITIONS

    redriven = await asyncio.to_thread(dlq, "redrive", "--all")
    assert len(redriven) == 7
    assert await queue_depth(channel, own.amqp.dead_letter_queue) == 0
    await eventually(lambda: _depths_are(channel, own.amqp, [1, 2, 4]))
    for partition, name in enumerate(own.amqp.partition_queues()):
        bodies = [message.body for message in await _take_all(channel, name)]
        products = {decode_order(body).product_id for body in bodies if body != POISON}
        assert products == {ghosts[partition]}
        assert (POISON in bodies) == (partition == 2)


async def test_what_the_broker_dead_letters_from_any_partition_reaches_the_one_dead_letter_queue(
    parted, new_product_id
):
    own, channel = parted
    products = _one_per_partition(new_product_id, own.amqp)
    orders = [_order(product, f"rejected-{product}") for product in products]
    await _publish(channel, own, orders)
    await eventually(lambda: _depths_are(channel, own.amqp, [1, 1, 1]))
    for name in own.amqp.partition_queues():  # as the broker does past the delivery limit
        [message] = await _take_all(channel, name)
        await message.reject(requeue=False)
    await eventually(lambda: _dead_are(channel, own, 3))
    letters = await DeadLetterQueue(own.amqp).peek()
    assert {(letter.id, letter.reason, letter.queue) for letter in letters} == {
        (order.request_id, "rejected", own.amqp.queue_of(order.product_id)) for order in orders
    }


async def _depths_are(channel, amqp: AMQPSettings, expected: list[int]) -> bool:
    return await _depths(channel, amqp) == expected


async def _dead_are(channel, own: Settings, count: int) -> bool:
    return await queue_depth(channel, own.amqp.dead_letter_queue) == count


@pytest.mark.slow  # a whole (small) sale: API and three consumer processes
def test_a_sale_on_three_partitions_keeps_every_invariant():
    flashsale = str(Path(sys.executable).with_name("flashsale"))
    argv = ["sale", "--json", "--partitions", "3", "--consumers", "3", "--stock", "40", "--requests", "500"]
    argv += ["--users", "200", "--concurrency", "32", "--noop-requests", "0"]
    result = subprocess.run([flashsale, *argv], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert report["ok"] is True and all(check["ok"] for check in report["invariants"].values())
    run = report["run"]
    assert (run["partitions"], run["consumer_partitions"]) == (3, [[0], [1], [2]])
    assert run["product_partition"] == run["product_id"] % 3
