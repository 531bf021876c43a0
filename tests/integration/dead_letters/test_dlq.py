"""The dead-letter tool (``flashsale dlq``) on the real RabbitMQ, Redis and MariaDB: each test has
queues of its own (``own_queues``), so its dead-letter queue holds only what the test put there."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import aio_pika
import pytest

from service.adapters.broker_topology import queue_depth
from service.adapters.dead_letters import DeadLetterQueue
from service.adapters.retry_routing import REASON
from service.bootstrap import ApiWorker, open_api
from service.domain.fulfilment.dead_letters import DeadLetterNotFound, DeadLetterService, PurgeOutcome
from service.domain.purchase.request_id import mint_request_id
from service.model.order_message import encode_order
from tests.support import (
    eventually,
    inventory,
    message_for,
    order_rows,
    own_queues,
    publish_raw,
    redis_state,
    running_consumer,
)
from toolkit.sale.isolation import environment

POISON = b"\x00not an order"


def _service(settings, engine, store, resources: ApiWorker) -> DeadLetterService:
    return DeadLetterService(DeadLetterQueue(settings.amqp), engine, store, resources.realigner)


async def _dead_depth(channel, settings, expected: int) -> bool:
    return await queue_depth(channel, settings.amqp.dead_letter_queue) == expected


async def _kill_waiting_orders(settings, count: int) -> None:
    """Reject (requeue=False) ``count`` messages of the order queue: the broker dead-letters
    them with reason ``rejected``, as the consumer does with a poison message."""
    connection = await aio_pika.connect(settings.amqp.url)
    try:
        channel = await connection.channel()
        queue = await channel.get_queue(settings.amqp.queue)
        for _ in range(count):
            message = await queue.get(no_ack=False, timeout=10)
            await message.reject(requeue=False)
    finally:
        await connection.close()


@pytest.fixture
async def mine(settings, request):
    async with own_queues(settings, request.node.name[-40:].replace("[", "-").replace("]", "")) as own:
        resources = await open_api(own)
        connection = await aio_pika.connect(own.amqp.url)
        try:
            yield own, resources, await connection.channel()
        finally:
            await connection.close()
            await resources.close()


async def test_poison_message_is_listed_redriven_dies_again_and_blocks_nothing(
    mine, engine, store, put_product, product_id
):
    own, resources, channel = mine
    await put_product(product_id, stock=5, limit=1)
    service = _service(own, engine, store, resources)
    good = message_for(product_id, "after-poison", 11)
    async with running_consumer(own, engine, store) as consumer:
        await publish_raw(channel, own, POISON, message_id="")
        await eventually(lambda: _dead_depth(channel, own, 1))

        [dead] = await service.entries()
        assert dead.order is None and dead.error and dead.detail  # the consumer said why
        assert (dead.reason, dead.count, dead.queue) == ("invalid_order", 1, own.amqp.queue)
        assert dead.died_at is not None
        assert await service.show(dead.id) == [dead]
        assert await queue_depth(channel, own.amqp.dead_letter_queue) == 1  # listing removed nothing

        [moved] = await service.redrive([dead.id])
        assert moved.id == dead.id
        await publish_raw(channel, own, encode_order(good), message_id=good.request_id)
        await eventually(lambda: order_rows(engine, product_id))  # the order behind it went through
        await eventually(lambda: _dead_depth(channel, own, 1))
        [again] = await service.entries()
        assert (again.id, again.reason, again.count) == (dead.id, "invalid_order", 2)  # it died once more
        assert consumer.counts.get("invalid") == 2
    assert [row.order_no for row in await order_rows(engine, product_id)] == [good.order_no]


async def test_redrive_puts_a_dead_order_through_and_a_second_redrive_is_a_no_op(
    mine, engine, store, put_product, product_id
):
    own, resources, channel = mine
    await put_product(product_id, stock=5, limit=2)
    accepted = await resources.purchases.purchase("redriven", product_id, 1, mint_request_id())
    await _kill_waiting_orders(own, 1)
    service = _service(own, engine, store, resources)
    [dead] = await service.entries()
    assert dead.id == accepted.request_id and dead.order is not None and dead.order.order_no == accepted.order_no
    assert dead.reason == "rejected"

    async with running_consumer(own, engine, store) as consumer:
        assert [view.id for view in await service.redrive(None)] == [accepted.request_id]
        await eventually(lambda: order_rows(engine, product_id))
        assert await inventory(engine, product_id) == (4, 1)
        # The same order dead-lettered again after it was applied: redriving it changes nothing.
        exchange = await channel.get_exchange(own.amqp.dead_letter_exchange)
        await exchange.publish(aio_pika.Message(dead.body.encode(), message_id=dead.id), routing_key=own.amqp.queue)
        await eventually(lambda: _dead_depth(channel, own, 1))
        await service.redrive([dead.id])
        await eventually(lambda: asyncio.sleep(0, consumer.counts.get("duplicate", 0) >= 1))
    assert await inventory(engine, product_id) == (4, 1)
    assert len(await order_rows(engine, product_id)) == 1
    assert await service.entries() == []


async def test_purge_gives_the_reservation_back_and_leaks_no_stock(
    mine, engine, store, redis, settings, put_product, product_id, client, admin
):
    own, resources, channel = mine
    await put_product(product_id, stock=3, limit=2)
    accepted = await resources.purchases.purchase("purged", product_id, 2, mint_request_id())
    assert (await redis_state(redis, settings, product_id))["stock"] == "1"
    await _kill_waiting_orders(own, 1)
    await publish_raw(channel, own, POISON, message_id="")
    await _kill_waiting_orders(own, 1)
    service = _service(own, engine, store, resources)
    dead = {view.id: view for view in await service.entries()}
    assert len(dead) == 2

    with pytest.raises(DeadLetterNotFound):
        await service.purge({accepted.request_id, "no-such-id"})
    assert len(await service.entries()) == 2  # an unknown id removes nothing

    purged = await service.purge(set(dead))
    outcomes = {item.id: item.outcome for item in purged}
    assert outcomes[accepted.request_id] is PurgeOutcome.GIVEN_BACK
    assert sorted(outcomes.values()) == sorted([PurgeOutcome.GIVEN_BACK, PurgeOutcome.NOT_AN_ORDER])
    assert await service.entries() == []

    state = await redis_state(redis, settings, product_id)
    assert (state["stock"], state["journal"], state["quota"]) == ("3", {}, {})
    assert await inventory(engine, product_id) == (3, 0) and await order_rows(engine, product_id) == []
    report = (await client.get(f"/api/v1/admin/products/{product_id}/stock", headers=admin)).json()
    assert report["drift"] == 0 and report["in_flight"] == 0
    # A late copy of the purged order (e.g. redriven from a backup) is dropped, not applied.
    async with running_consumer(own, engine, store) as consumer:
        await publish_raw(channel, own, dead[accepted.request_id].body.encode(), accepted.request_id)
        await eventually(lambda: asyncio.sleep(0, consumer.counts.get("released", 0) >= 1))
    assert await order_rows(engine, product_id) == [] and await inventory(engine, product_id) == (3, 0)


async def test_purge_of_an_order_mysql_has_gives_nothing_back(mine, engine, store, put_product, product_id):
    own, resources, channel = mine
    await put_product(product_id, stock=4, limit=1)
    service = _service(own, engine, store, resources)
    async with running_consumer(own, engine, store):
        accepted = await resources.purchases.purchase("applied", product_id, 1, mint_request_id())
        await eventually(lambda: order_rows(engine, product_id))
    message = message_for(product_id, "applied", 0)
    body = encode_order(type(message)(accepted.request_id, accepted.order_no, "applied", product_id, 1, 0, 1500))
    await publish_raw(channel, own, body, accepted.request_id)
    await _kill_waiting_orders(own, 1)
    [purged] = await service.purge([accepted.request_id])
    assert purged.outcome is PurgeOutcome.ALREADY_IN_MYSQL and purged.realign is None
    assert await inventory(engine, product_id) == (3, 1)
    assert await store.stock.units(product_id) == 3


@pytest.mark.slow
async def test_cli_lists_shows_and_refuses_unknown_ids(mine, engine, store):
    own, resources, channel = mine
    await publish_raw(channel, own, POISON, message_id="poison-1")
    await _kill_waiting_orders(own, 1)
    flashsale = str(Path(sys.executable).with_name("flashsale"))
    env = {**os.environ, **environment(own)}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([flashsale, "dlq", *args], env=env, capture_output=True, text=True, timeout=60)

    listed = await asyncio.to_thread(run, "list", "--json")
    assert listed.returncode == 0, listed.stderr
    [entry] = json.loads(listed.stdout)
    assert (entry["id"], entry["reason"], entry["count"], entry["order"]) == ("poison-1", "rejected", 1, None)
    shown = await asyncio.to_thread(run, "show", "poison-1", "--json")
    assert json.loads(shown.stdout)[0]["body"] == POISON.decode("utf-8", errors="replace")
    unknown = await asyncio.to_thread(run, "purge", "nope")
    assert unknown.returncode == 1 and "nope" in unknown.stderr
    table = await asyncio.to_thread(run, "list")
    assert "poison-1" in table.stdout and "rejected" in table.stdout
    purged = await asyncio.to_thread(run, "purge", "poison-1", "--json")
    assert json.loads(purged.stdout)[0]["outcome"] == "not_an_order"
    assert json.loads((await asyncio.to_thread(run, "list", "--json")).stdout) == []


async def test_a_republished_order_that_lands_leaves_no_stale_copy_in_the_dead_letter_queue(
    mine, engine, store, put_product, product_id
):
    """Guards a bug the fault suite found (docs/RELIABILITY.md): after MySQL was down long enough
    to dead-letter the orders in hand, realignment re-published them and they landed, but their
    dead copies stayed in the queue."""
    from service.domain.stock.realign import Realigner

    own, resources, channel = mine
    await put_product(product_id, stock=5, limit=2)
    accepted = [await resources.purchases.purchase(f"dead-{i}", product_id, 1, mint_request_id()) for i in (1, 2)]
    await _kill_waiting_orders(own, 2)
    await publish_raw(channel, own, POISON, message_id="")
    await _kill_waiting_orders(own, 1)
    service = _service(own, engine, store, resources)
    assert len(await service.entries()) == 3

    async with running_consumer(own, engine, store):
        eager = Realigner(engine, store, grace_seconds=0, publisher=resources.publisher)
        await asyncio.sleep(0.01)
        assert (await eager.realign(product_id)).republished == 2
        await eventually(lambda: _rows(engine, product_id, 2))
    assert await service.drop_landed() == 2
    [left] = await service.entries()
    assert left.order is None  # the poison message stays for the operator
    assert {row.order_no for row in await order_rows(engine, product_id)} == {a.order_no for a in accepted}


async def _rows(engine, product_id: int, count: int) -> bool:
    return len(await order_rows(engine, product_id)) == count


async def _dead_lettered_twice(own, resources, channel, product_id: int, user: str) -> str:
    """An accepted order in the dead-letter queue twice, as when its consumer is killed right
    after dead-lettering it (before the ack) and the redelivery dies again; its request id."""
    accepted = await resources.purchases.purchase(user, product_id, 1, mint_request_id())
    await _kill_waiting_orders(own, 1)
    [dead] = await _service(own, None, None, resources).entries()
    exchange = await channel.get_exchange(own.amqp.dead_letter_exchange)
    await exchange.publish(
        aio_pika.Message(dead.body.encode(), message_id=dead.id, headers={REASON: "rejected"}),
        routing_key=own.amqp.queue,
    )
    await eventually(lambda: _dead_depth(channel, own, 2))
    return accepted.request_id


async def test_an_order_dead_lettered_twice_is_listed_and_redriven_once(mine, engine, store, put_product, product_id):
    own, resources, channel = mine
    await put_product(product_id, stock=5, limit=2)
    request_id = await _dead_lettered_twice(own, resources, channel, product_id, "twice")
    service = _service(own, engine, store, resources)
    [view] = await service.entries()
    assert (view.id, view.copies) == (request_id, 2)
    assert [view.id for view in await service.show(request_id)] == [request_id]

    assert [view.id for view in await service.redrive([request_id])] == [request_id]
    assert await queue_depth(channel, own.amqp.queue) == 1  # one copy back on the order queue
    assert await _dead_depth(channel, own, 0)
    async with running_consumer(own, engine, store):
        await eventually(lambda: order_rows(engine, product_id))
    assert await inventory(engine, product_id) == (4, 1)


async def test_an_order_dead_lettered_twice_is_purged_once(mine, engine, store, put_product, product_id):
    own, resources, channel = mine
    await put_product(product_id, stock=5, limit=2)
    request_id = await _dead_lettered_twice(own, resources, channel, product_id, "purged-twice")
    purged = await _service(own, engine, store, resources).purge([request_id])
    assert [(one.id, one.outcome) for one in purged] == [(request_id, PurgeOutcome.GIVEN_BACK)]
    assert await _dead_depth(channel, own, 0)
