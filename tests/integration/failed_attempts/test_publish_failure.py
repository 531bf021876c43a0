"""A publish that fails gives the reservation back; a late copy of its message is dropped."""

from __future__ import annotations

import aio_pika
import pytest

from consumers.order_consumer import OrderConsumer
from service.api.app import create_app
from service.bootstrap import open_api
from service.domain.order_numbers.format import compose_order_no
from service.domain.purchase.answers import PurchaseRejected
from service.domain.purchase.request_id import mint_request_id
from service.model.order_message import OrderMessage, encode_order
from service.model.stock import ReserveRequest
from tests.support import inventory, order_rows, redis_state, serving


@pytest.fixture
async def unroutable_client(settings):
    """An API whose order queue binding is gone: every publish comes back unroutable."""
    broken = settings.model_copy(
        update={"amqp": settings.amqp.model_copy(update={"queue": f"{settings.redis.key_prefix}.nowhere"})}
    )
    try:
        async with serving(create_app(broken), timeout=30) as client:
            connection = await aio_pika.connect(settings.amqp.url)
            channel = await connection.channel()
            await channel.queue_delete(broken.amqp.queue)
            await connection.close()
            yield client
    finally:
        connection = await aio_pika.connect(settings.amqp.url)
        try:
            channel = await connection.channel()
            for queue in broken.amqp.retry_queues():  # declared with the API's topology
                await channel.queue_delete(queue)
        finally:
            await connection.close()


async def test_unroutable_publish_is_503_and_returns_the_stock(
    unroutable_client, client, token, put_product, product_id, redis, settings, engine
):
    await put_product(product_id, stock=3, limit=1)
    before = await redis_state(redis, settings, product_id)
    headers = {**token("unlucky"), "Idempotency-Key": "attempt"}
    body = {"product_id": product_id, "quantity": 1}

    failed = await unroutable_client.post("/api/v1/orders", json=body, headers=headers)
    assert failed.status_code == 503 and failed.json()["code"] == "unavailable"
    assert int(failed.headers["retry-after"]) >= 1
    after = await redis_state(redis, settings, product_id)
    assert (after["stock"], after["journal"], after["quota"]) == (before["stock"], {}, {})

    retried = await client.post("/api/v1/orders", json=body, headers=headers)
    assert retried.status_code == 202
    assert (await redis_state(redis, settings, product_id))["stock"] == "2"
    assert await order_rows(engine, product_id) == []


async def test_broker_connection_down_gives_unavailable_and_returns_the_stock(settings, put_product, product_id, redis):
    await put_product(product_id, stock=3, limit=1)
    resources = await open_api(settings)
    try:
        await resources.publisher.close()
        with pytest.raises(PurchaseRejected) as rejected:
            await resources.purchases.purchase("u", product_id, 1, mint_request_id())
    finally:
        await resources.close()
    assert rejected.value.code == "unavailable"
    state = await redis_state(redis, settings, product_id)
    assert (state["stock"], state["journal"], state["quota"]) == ("3", {}, {})


async def test_release_after_a_consumer_claimed_keeps_the_order(store, put_product, product_id, redis):
    await put_product(product_id, stock=3, limit=1)
    keys = store.product_keys(product_id)
    request_id = "0" * 31 + "1"
    outcome = await store.reservations.reserve(
        ReserveRequest(product_id, request_id, "u", 1, compose_order_no("FS", "20261130000000", 98, 1), "a1")
    )
    assert outcome.outcome == "reserved"
    assert await store.reservations.claim(product_id, request_id) == "held"
    release = await store.reservations.release(product_id, request_id, "a1")
    assert release == "claimed"
    assert await redis.get(keys.stock) == "2"
    assert request_id in await redis.hgetall(keys.journal)


async def test_late_copy_of_a_released_message_is_dropped(store, put_product, product_id, redis, engine):
    await put_product(product_id, stock=3, limit=1)
    keys = store.product_keys(product_id)
    request_id = "0" * 31 + "2"
    order_no = compose_order_no("FS", "20261130000000", 98, 2)
    reserved_at = (
        await store.reservations.reserve(ReserveRequest(product_id, request_id, "u", 1, order_no, "a2"))
    ).reserved_at_ms
    assert await store.reservations.release(product_id, request_id, "a2") == "released"
    assert await store.reservations.release(product_id, request_id, "a2") == "absent"  # idempotent

    consumer = OrderConsumer(engine, store)
    late = _FakeDelivery(
        encode_order(OrderMessage(request_id, order_no, "u", product_id, 1, reserved_at, 1500, attempt="a2"))
    )
    consumer.handle(late)  # type: ignore[arg-type]  # a stand-in for the Delivery
    await consumer.drain()
    assert late.settled == "ack"
    assert consumer.counts == {"released": 1}
    assert await order_rows(engine, product_id) == []
    assert await inventory(engine, product_id) == (3, 0)
    assert await redis.get(keys.stock) == "3"


class _FakeDelivery:
    """Stands in for the AMQP delivery object only (the broker is not under test here);
    Redis and MySQL behind the consumer are real."""

    def __init__(self, body: bytes) -> None:
        self.body = body
        self.message_id = "late"
        self.correlation_id = None
        self.channel = None
        self.delivery_tag = 1
        self.settled: str | None = None

    async def ack(self, multiple: bool = False) -> None:
        self.settled = "ack"

    async def nack(self, requeue: bool = True) -> None:
        self.settled = "nack"

    async def reject(self, requeue: bool = False) -> None:
        self.settled = "reject"
