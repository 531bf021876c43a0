"""Publish mode ``async`` on the real services: 202 once reserved, published in the background,
nothing accepted is lost when the broker cannot take it (it arrives later, or via realignment)."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator

import aio_pika
import httpx
import pytest

from service.adapters.broker_topology import declare_topology
from service.api.app import create_app
from service.bootstrap import Job, open_api, open_job, opened
from service.domain.purchase.request_id import mint_request_id
from service.settings import Settings
from tests.support import buy, eventually, inventory, order_rows, own_queues, redis_state, running_consumer, serving


def _async_mode(settings: Settings, **amqp: object) -> Settings:
    return settings.model_copy(
        update={
            "orders": settings.orders.model_copy(update={"publish_mode": "async"}),
            "amqp": settings.amqp.model_copy(update=amqp),
        }
    )


@pytest.fixture(scope="module")
async def async_client(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    async with serving(create_app(_async_mode(settings)), timeout=30) as client:
        yield client


async def _rows(engine, product_id: int, count: int):
    rows = await order_rows(engine, product_id)
    return rows if len(rows) >= count else None


async def test_a_burst_in_async_mode_ends_as_exactly_the_accepted_order_rows(
    async_client, token, put_product, product_id, engine, redis, settings, consumer
):
    await put_product(product_id, stock=50, limit=1)
    responses = await asyncio.gather(*(buy(async_client, token(f"a{i}"), product_id) for i in range(300)))
    assert Counter(r.status_code for r in responses) == {202: 50, 409: 250}
    accepted = {r.json()["order_no"] for r in responses if r.status_code == 202}
    assert len(accepted) == 50

    rows = await eventually(lambda: _rows(engine, product_id, 50))
    await asyncio.sleep(0.3)  # nothing beyond the 50 arrives late
    assert len(await order_rows(engine, product_id)) == 50
    assert {row.order_no for row in rows} == accepted and all(row.status == 0 for row in rows)
    assert await inventory(engine, product_id) == (0, 50)
    assert (await redis_state(redis, settings, product_id))["stock"] == "0"


async def test_a_retry_right_after_an_async_202_is_the_same_202(async_client, token, put_product, product_id):
    await put_product(product_id, stock=5, limit=1)
    headers = token("impatient")
    first = await buy(async_client, headers, product_id, key="once")
    again = await buy(async_client, headers, product_id, key="once")
    assert first.status_code == again.status_code == 202
    assert again.json() == first.json()
    view = await async_client.get(f"/api/v1/orders/{first.json()['order_no']}", headers=headers)
    assert view.status_code == 200 and view.json()["status"] in {"queued", "pending_payment"}


async def _set_route(settings: Settings, bound: bool) -> None:
    """Bind or unbind the order queue: unbound, every publish comes back unroutable (an outage)."""
    connection = await aio_pika.connect(settings.amqp.url)
    channel = await connection.channel()
    exchange, (queue,) = await declare_topology(channel, settings.amqp)
    if bound:
        await queue.bind(exchange, routing_key=settings.amqp.queue)
    else:
        await queue.unbind(exchange, routing_key=settings.amqp.queue)
    await connection.close()


async def test_a_publisher_outage_in_async_mode_loses_no_accepted_order(
    settings, put_product, product_id, engine, store, redis
):
    async with own_queues(settings, "outage") as mine:
        await _outage_loses_nothing(mine, put_product, product_id, engine, store, redis)


async def _outage_loses_nothing(mine: Settings, put_product, product_id, engine, store, redis) -> None:
    outage = _async_mode(mine)
    outage = outage.model_copy(update={"realign": outage.realign.model_copy(update={"grace_seconds": 0.0})})
    await put_product(product_id, stock=30, limit=1)

    # 1. The broker routes nothing for a while: the orders are accepted and arrive once it recovers.
    resources = await open_api(outage)
    assert resources.purchases is not None and resources.background is not None
    await _set_route(outage, bound=False)
    first = [await resources.purchases.purchase(f"o{i}", product_id, 1, mint_request_id()) for i in range(20)]
    await asyncio.sleep(0.5)
    assert resources.background.pending == 20  # every one retried, none confirmed, none given back
    assert (await redis_state(redis, outage, product_id))["stock"] == "10"
    await _set_route(outage, bound=True)

    # 2. Still down when the process shuts down: the flush gives up, realignment re-publishes.
    await eventually(lambda: _true(resources.background.pending == 0))
    await _set_route(outage, bound=False)
    second = [await resources.purchases.purchase(f"p{i}", product_id, 1, mint_request_id()) for i in range(5)]
    await resources.close()
    await _set_route(outage, bound=True)

    accepted = {a.order_no for a in [*first, *second]}
    async with running_consumer(outage, engine, store), opened(open_job(outage)) as realigning:
        await eventually(lambda: _realigned_until(realigning, engine, product_id, 25))
        rows = await order_rows(engine, product_id)
    assert {row.order_no for row in rows} == accepted and len(rows) == 25
    assert await inventory(engine, product_id) == (5, 25)


async def _true(value: bool) -> bool:
    return value


async def _realigned_until(resources: Job, engine, product_id: int, count: int) -> bool:
    if len(await order_rows(engine, product_id)) >= count:
        return True
    await resources.realigner.realign(product_id)
    await asyncio.sleep(0.2)
    return False
