"""The API's group publishing on the real Redis, RabbitMQ and MariaDB (docs/ARCHITECTURE.md,
"Order messages and groups"): a burst of purchases leaves in groups and lands as exactly the
accepted orders; a group the broker nacks, or whose confirm is lost, answers each of its
requests as a message of its own would; realignment's re-publishing groups too."""

from __future__ import annotations

import asyncio
from collections import Counter

import aio_pika
import pytest

from consumers.consume import consuming
from consumers.order_consumer import OrderConsumer
from service.adapters.broker import Publisher
from service.adapters.broker_topology import queue_depth
from service.adapters.publish_groups import Group
from service.api.app import create_app
from service.bootstrap import open_api
from service.domain.order_numbers.format import compose_order_no
from service.domain.purchase.answers import PurchaseRejected
from service.domain.purchase.request_id import mint_request_id
from service.domain.stock.realign import Realigner
from service.failures import PublishFailed
from service.model.stock import ReserveRequest
from service.settings import Settings
from tests.integration.groups.conftest import orders_in, take_all
from tests.support import buy, eventually, inventory, order_rows, publish_raw, redis_state, rows_are, serving


async def test_hundreds_of_simultaneous_purchases_leave_in_groups_and_land_exactly(
    own, channel, put_product, product_id, token, engine, store, redis
):
    await put_product(product_id, stock=120, limit=1)
    async with serving(create_app(own), timeout=60) as api:
        responses = await asyncio.gather(*(buy(api, token(f"crowd{i}"), product_id) for i in range(400)))
    assert Counter(r.status_code for r in responses) == {202: 120, 409: 280}
    accepted = {r.json()["order_no"] for r in responses if r.status_code == 202}

    messages = await take_all(channel, own.amqp.queue)
    orders = orders_in(messages)
    assert sorted(order.order_no for order in orders) == sorted(accepted)  # each once, none more
    assert len(messages) < len(orders)  # they shared messages
    for message in messages:
        carried = orders_in([message])
        if len(carried) > 1:  # a group: its own id; every order keeps its request id and price
            assert message.message_id not in {order.request_id for order in carried}
            assert all(order.amount == 1500 for order in carried)
        else:
            assert message.message_id == carried[0].request_id

    consumer = OrderConsumer(engine, store)
    async with consuming(own.amqp, consumer, prefetch=8):
        for message in messages:  # the very bodies the API published
            await publish_raw(channel, own, message.body, message.message_id or "")
        await eventually(lambda: rows_are(engine, product_id, 120))
    assert consumer.counts.get("applied") == 120 and consumer.counts.get("rejected", 0) == 0
    assert await inventory(engine, product_id) == (0, 120)
    assert {row.order_no for row in await order_rows(engine, product_id)} == accepted


async def _purchases(own: Settings, product_id: int, count: int, who: str, after_confirm=None, prepare=None):
    """``count`` purchases at once through an API process's purchase path on ``own``; returns how
    many orders each message carried and each purchase's outcome (its answer or its rejection).
    ``prepare()`` runs once the API is up; ``after_confirm(group)`` once the broker confirmed a
    message (to lose the confirm there)."""
    resources = await open_api(own)
    sizes: list[int] = []
    send = resources.publisher._send_group

    async def recorded(group: Group) -> None:
        sizes.append(len(group.orders))
        await send(group)
        if after_confirm is not None:
            await after_confirm(group)

    if resources.publisher._grouper is not None:  # None with group_max 1
        resources.publisher._grouper._send = recorded
    try:
        if prepare is not None:
            await prepare()
        outcomes = await asyncio.gather(
            *(resources.purchases.purchase(f"{who}{i}", product_id, 1, mint_request_id()) for i in range(count)),
            return_exceptions=True,
        )
    finally:
        await resources.close()
    return sizes, outcomes


async def test_a_nacked_group_releases_every_order(own, channel, put_product, product_id, redis):
    await put_product(product_id, stock=30, limit=1)
    before = await redis_state(redis, own, product_id)
    sizes, outcomes = await _purchases(own, product_id, 20, "nacked", prepare=lambda: _refusing(own, channel))
    assert sizes == [20]  # one message carried them all
    assert [getattr(outcome, "code", outcome) for outcome in outcomes] == ["unavailable"] * 20
    after = await redis_state(redis, own, product_id)
    assert (after["stock"], after["journal"], after["quota"]) == (before["stock"], {}, {})


async def _refusing(own: Settings, channel) -> None:
    """Replace ``own``'s order queue (the API declared it) by one that is full and refuses what is
    published to it: the broker nacks every publish."""
    underlay = await channel.get_underlay_channel()
    await underlay.queue_delete(own.amqp.queue)
    full = await channel.declare_queue(
        own.amqp.queue,
        durable=True,
        arguments={"x-queue-type": "quorum", "x-max-length": 1, "x-overflow": "reject-publish"},
    )
    await full.bind(own.amqp.exchange, routing_key=own.amqp.queue)
    exchange = await channel.get_exchange(own.amqp.exchange)
    for _ in range(2):  # a quorum queue takes one beyond its length
        await exchange.publish(aio_pika.Message(b"filler"), routing_key=own.amqp.queue)
    await eventually(lambda: _depth_at_least(channel, own.amqp.queue, 2))


async def _depth_at_least(channel, queue: str, count: int) -> bool:
    return await queue_depth(channel, queue) >= count


async def test_a_group_whose_confirm_is_lost_answers_each_request_as_a_lone_message_would(
    own, channel, put_product, product_id, redis, engine, store
):
    """The message reached the queue, the confirm did not come back: with no consumer having
    claimed the orders, each request releases its reservation (503) and the consumer drops the
    late group order by order; once a consumer has claimed them, each request answers 202."""
    await put_product(product_id, stock=30, limit=1)
    before = await redis_state(redis, own, product_id)

    async def lose_confirm(_group: Group) -> None:
        raise PublishFailed("confirm lost")

    sizes, released = await _purchases(own, product_id, 10, "lost", lose_confirm)
    assert sizes == [10]
    assert [getattr(outcome, "code", outcome) for outcome in released] == ["unavailable"] * 10
    after = await redis_state(redis, own, product_id)
    assert (after["stock"], after["journal"], after["quota"]) == (before["stock"], {}, {})
    assert await queue_depth(channel, own.amqp.queue) == 1  # the group did arrive

    consumer = OrderConsumer(engine, store)
    async with consuming(own.amqp, consumer, prefetch=8):

        async def claimed_first(group: Group) -> None:
            """The consumer writes the group before the API hears of its confirm."""
            await eventually(lambda: rows_are(engine, product_id, len(group.orders)))
            raise PublishFailed("confirm lost")

        await eventually(lambda: _released(consumer, 10))
        sizes, kept = await _purchases(own, product_id, 10, "kept", claimed_first)
    assert sizes == [10]
    assert not [outcome for outcome in kept if isinstance(outcome, (PurchaseRejected, BaseException))]
    assert len(await order_rows(engine, product_id)) == 10
    assert await inventory(engine, product_id) == (20, 10)
    assert consumer.counts.get("applied") == 10 and consumer.counts.get("released") == 10


async def _released(consumer: OrderConsumer, count: int) -> bool:
    return consumer.counts.get("released", 0) == count


@pytest.mark.parametrize("group_max", [1, 64])
async def test_group_max_one_sends_one_order_per_message_in_the_single_format(
    own, channel, put_product, product_id, group_max
):
    await put_product(product_id, stock=10, limit=1)
    settings = own.model_copy(update={"amqp": own.amqp.model_copy(update={"group_max": group_max})})
    _, accepted = await _purchases(settings, product_id, 10, f"max{group_max}")
    messages = await take_all(channel, own.amqp.queue)
    assert sorted(order.request_id for order in orders_in(messages)) == sorted(a.request_id for a in accepted)  # type: ignore[attr-defined]
    if group_max == 1:
        assert len(messages) == 10
        assert all(message.message_id == orders_in([message])[0].request_id for message in messages)
        assert all(message.body.startswith(b'{"request_id"') for message in messages)
    else:
        assert len(messages) == 1


async def test_realignment_republishes_a_products_overdue_reservations_in_one_group(
    own, channel, put_product, product_id, engine, store
):
    """Reservations whose API died before publishing: one realignment pass re-publishes them side
    by side, so they leave in one group, and each lands as its own order."""
    await put_product(product_id, stock=20, limit=1)
    stranded = []
    for i in range(12):
        request_id, order_no = mint_request_id(), compose_order_no("FS", "20261203000000", 96, 9_000 + i)
        assert (
            await store.reservations.reserve(ReserveRequest(product_id, request_id, f"crashed{i}", 1, order_no, "a"))
        ).outcome == ("reserved")
        stranded.append(order_no)
    publisher = Publisher(own.amqp)
    await publisher.connect()
    try:
        assert (
            await Realigner(engine, store, grace_seconds=0, publisher=publisher).realign(product_id)
        ).republished == 12
    finally:
        await publisher.close()
    messages = await take_all(channel, own.amqp.queue)
    assert len(messages) == 1 and sorted(order.order_no for order in orders_in(messages)) == sorted(stranded)
    consumer = OrderConsumer(engine, store)
    async with consuming(own.amqp, consumer, prefetch=8):
        await publish_raw(channel, own, messages[0].body, messages[0].message_id or "")
        await eventually(lambda: rows_are(engine, product_id, 12))
    assert await inventory(engine, product_id) == (8, 12)
