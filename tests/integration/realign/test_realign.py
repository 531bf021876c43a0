"""Realignment: exact while the sale is live, never an overwrite of live stock."""

from __future__ import annotations

import asyncio
import random
from collections import Counter

import pytest
from sqlalchemy import text

from service.adapters.broker import Publisher
from service.adapters.redis.reservations import new_attempt
from service.adapters.redis.stores import open_stores
from service.domain.fulfilment.order_writer import apply_order
from service.domain.order_numbers.format import compose_order_no
from service.domain.purchase.request_id import mint_request_id
from service.domain.stock.realign import Realigner
from service.model.order_message import OrderMessage
from service.model.stock import ReserveRequest
from tests.support import (
    RunsAfterJournalRead,
    buy,
    eventually,
    inventory,
    order_rows,
    redis_state,
    rows_at_least,
)


@pytest.fixture
def realigner(engine, store):
    return Realigner(engine, store, grace_seconds=60)


async def test_drift_is_repaired_and_reported(realigner, put_product, product_id, redis, store):
    await put_product(product_id, stock=7, limit=1)
    keys = store.product_keys(product_id)
    await redis.set(keys.stock, 3)
    dry = await realigner.realign(product_id, dry_run=True)
    assert (dry.redis_stock_before, dry.redis_stock_after, dry.drift) == (3, 7, -4)
    assert await redis.get(keys.stock) == "3"  # the dry run wrote nothing
    report = await realigner.realign(product_id)
    assert (report.mysql_stock, report.redis_stock_before, report.redis_stock_after, report.drift) == (7, 3, 7, -4)
    assert await redis.get(keys.stock) == "7"


async def test_reloading_a_live_product_keeps_reservations_in_flight(
    client, token, put_product, product_id, redis, store
):
    await put_product(product_id, stock=10, limit=1)
    for i in range(4):  # no consumer: four reservations stay in flight
        response = await client.post(
            "/api/v1/orders", json={"product_id": product_id, "quantity": 1}, headers=token(f"f{i}")
        )
        assert response.status_code == 202
    report = await put_product(product_id, stock=10, limit=1)
    assert report["in_flight_units"] == 4
    assert await redis.get(store.product_keys(product_id).stock) == "6"


async def test_stale_reservation_without_order_is_republished(
    engine, redis, store, settings, put_product, product_id, consumer
):
    """The API died between reserve and publish: realignment publishes it after the grace period."""
    await put_product(product_id, stock=5, limit=1)
    keys = store.product_keys(product_id)
    request_id = mint_request_id()
    order_no = compose_order_no("FS", "20261130000000", 97, product_id)
    outcome = await store.reservations.reserve(ReserveRequest(product_id, request_id, "crashed", 1, order_no, "a1"))
    assert outcome.outcome == "reserved"

    publisher = Publisher(settings.amqp)
    await publisher.connect()
    try:
        patient = Realigner(engine, store, grace_seconds=60, publisher=publisher)
        assert (await patient.realign(product_id)).republished == 0  # still inside the grace period
        eager = Realigner(engine, store, grace_seconds=0, publisher=publisher)
        await asyncio.sleep(0.01)
        assert (await eager.realign(product_id)).republished == 1
    finally:
        await publisher.close()

    rows = await eventually(lambda: order_rows(engine, product_id))
    assert [(row.order_no, row.request_id, row.status) for row in rows] == [(order_no, request_id, 0)]
    assert await redis.hget(keys.replay(request_id), "state") == "queued"
    final = await Realigner(engine, store, 60).realign(product_id)
    assert (final.mysql_stock, final.redis_stock_after, final.in_flight) == (4, 4, 0)


async def test_a_republished_reservation_is_priced_as_when_it_was_reserved(
    engine, redis, store, settings, put_product, product_id, consumer
):
    """Reserved at 1500 a unit; the price then changes to 2100 (``product set --price``, the same
    ``set_product`` as the admin route); realignment re-publishes the overdue reservation at 1500."""
    await put_product(product_id, stock=5, limit=2, price=1500)
    keys = store.product_keys(product_id)
    request_id = mint_request_id()
    order_no = compose_order_no("FS", "20261130000000", 92, product_id)
    reservation = await store.reservations.reserve(ReserveRequest(product_id, request_id, "priced", 2, order_no, "a1"))
    assert (reservation.outcome, reservation.unit_price) == ("reserved", 1500)
    await put_product(product_id, stock=5, limit=2, price=2100)
    assert await redis.hget(keys.sale, "price") == "2100"
    assert [entry.unit_price for entry in await store.stock.journal(product_id)] == [1500]

    publisher = Publisher(settings.amqp)
    await publisher.connect()
    try:
        await asyncio.sleep(0.01)
        eager = Realigner(engine, store, grace_seconds=0, publisher=publisher)
        assert (await eager.realign(product_id)).republished == 1
    finally:
        await publisher.close()

    await eventually(lambda: order_rows(engine, product_id))
    async with engine.connect() as conn:
        rows = await conn.execute(
            text("SELECT order_no, quantity, amount FROM orders WHERE product_id = :p"), {"p": product_id}
        )
        assert [tuple(row) for row in rows] == [(order_no, 2, 1500 * 2)]


async def test_entries_written_before_the_unit_price_was_recorded_still_count(
    engine, redis, store, settings, put_product, product_id, realigner
):
    """A journal entry of the old shape (``user|quantity|order_no|reserved_at_ms|claimed``, left
    by the previous version during an upgrade) is read by realign.lua and the Redis adapter."""
    await put_product(product_id, stock=5, limit=2)
    keys = store.product_keys(product_id)
    order_no = compose_order_no("FS", "20261130000000", 91, product_id)
    await redis.decrby(keys.stock, 2)
    await redis.hset(keys.journal, "old-entry", f"legacy|2|{order_no}|1764460800123|0")
    await redis.delete(keys.units)  # the previous version kept no units counter: a full pass sets it
    [entry] = await store.stock.journal(product_id)
    assert (entry.user_id, entry.quantity, entry.order_no, entry.unit_price) == ("legacy", 2, order_no, None)
    report = await realigner.realign(product_id)
    assert (report.redis_stock_after, report.in_flight, report.in_flight_units) == (3, 1, 2)
    assert await redis.hgetall(keys.quota) == {"legacy": "2"}
    assert await redis.get(keys.units) == "2"


async def test_realignment_during_live_purchases_and_consumers_ends_exact(
    client, token, put_product, product_id, realigner, engine, redis, settings, consumer
):
    stock = 120
    await put_product(product_id, stock=stock, limit=2)
    headers = [token(f"live{i}") for i in range(150)]
    stop = asyncio.Event()
    passes: list = []

    async def realign_continuously():
        while not stop.is_set():
            passes.append(await realigner.realign(product_id))
            await asyncio.sleep(random.uniform(0, 0.01))

    async def buyer(i: int):
        await asyncio.sleep(random.uniform(0, 0.3))
        quantity = 1 + i % 2
        return await client.post(
            "/api/v1/orders", json={"product_id": product_id, "quantity": quantity}, headers=headers[i]
        )

    looping = asyncio.create_task(realign_continuously())
    responses = await asyncio.gather(*(buyer(i) for i in range(150)))
    accepted_units = sum(r.json()["quantity"] for r in responses if r.status_code == 202)
    accepted = sum(1 for r in responses if r.status_code == 202)
    assert Counter(r.status_code for r in responses).keys() <= {202, 409}

    async def drained():
        rows = await order_rows(engine, product_id)
        return len(rows) == accepted

    await eventually(drained)
    stop.set()
    await looping
    assert any(p.in_flight > 0 for p in passes)  # passes ran while reservations were in flight

    final = await realigner.realign(product_id)
    mysql_stock, sold = await inventory(engine, product_id)
    assert sold == accepted_units == stock  # demand (225 units) exceeded supply: sold out exactly
    assert mysql_stock == 0
    assert final.redis_stock_after == mysql_stock and final.in_flight == 0
    assert (await redis_state(redis, settings, product_id))["journal"] == {}
    assert all(p.redis_stock_after >= 0 for p in passes)


async def test_commits_between_snapshot_and_redis_write_do_not_skew_the_result(
    engine, redis, store, settings, put_product, product_id
):
    from service.domain.fulfilment.order_writer import apply_order
    from service.model.order_message import OrderMessage

    await put_product(product_id, stock=10, limit=1)
    keys = store.product_keys(product_id)

    async def reserve(user: str, sequence: int) -> OrderMessage:
        request_id = mint_request_id()
        order_no = compose_order_no("FS", "20261130000001", 96, product_id * 10 + sequence)
        reservation = await store.reservations.reserve(
            ReserveRequest(product_id, request_id, user, 1, order_no, new_attempt())
        )
        assert reservation.outcome == "reserved"
        return OrderMessage(request_id, order_no, user, product_id, 1, reservation.reserved_at_ms, 1500)

    a, b = await reserve("a", 1), await reserve("b", 2)

    async def consumers_commit():
        await apply_order(engine, a)  # an entry the job already read commits
        await apply_order(engine, await reserve("c", 3))  # a new reservation appears and commits

    racing = Realigner(
        engine, open_stores(RunsAfterJournalRead(redis, consumers_commit), settings.redis.key_prefix), 60
    )
    report = await racing.realign(product_id)
    # Truth afterwards: MySQL 10 - 2 (a, c) = 8, in flight: b  ->  Redis must be 7.
    assert await inventory(engine, product_id) == (8, 2)
    assert report.redis_stock_after == 7 and await redis.get(keys.stock) == "7"

    settled = await Realigner(engine, store, 60).realign(product_id)
    assert (settled.redis_stock_after, settled.in_flight, settled.resolved_dropped) == (7, 1, 2)
    assert list(await redis.hgetall(keys.journal)) == [b.request_id]


# Regression tests from the adversarial review.


async def test_an_older_realignment_pass_never_overwrites_a_newer_one(
    engine, redis, store, settings, put_product, product_id
):
    """Guards: a slow realignment pass wrote its stale stock over the result of a newer pass."""
    await put_product(product_id, stock=10, limit=1)
    request_id = mint_request_id()
    order_no = compose_order_no("FS", "20261130000002", 95, product_id)
    reserved_at = (
        await store.reservations.reserve(ReserveRequest(product_id, request_id, "e", 1, order_no, "a1"))
    ).reserved_at_ms
    prefix = settings.redis.key_prefix

    async def consumer_commits_then_another_pass_runs():
        await apply_order(engine, OrderMessage(request_id, order_no, "e", product_id, 1, reserved_at, 1500))
        newer = await Realigner(engine, store, 60).realign(product_id)
        assert (newer.redis_stock_after, newer.resolved_dropped) == (9, 1)

    older = Realigner(
        engine, open_stores(RunsAfterJournalRead(redis, consumer_commits_then_another_pass_runs), prefix), 60
    )
    report = await older.realign(product_id)
    assert report.skipped_stale
    state = await redis_state(redis, settings, product_id)
    assert (state["stock"], state["journal"], state["quota"]) == ("9", {}, {"e": "1"})
    assert await inventory(engine, product_id) == (9, 1)


async def test_redis_data_loss_is_repaired_by_one_realignment(
    client, token, put_product, product_id, engine, redis, store, consumer
):
    """Guards: after Redis lost a product's keys, realignment did not rebuild stock, terms and quotas from MySQL."""
    await put_product(product_id, stock=5, limit=1)
    assert (await buy(client, token("before-loss"), product_id)).status_code == 202
    await eventually(lambda: rows_at_least(engine, product_id, 1))
    keys = store.product_keys(product_id)
    await redis.delete(keys.stock, keys.sale, keys.quota, keys.journal, keys.versions)
    assert (await buy(client, token("during-loss"), product_id)).status_code == 503

    await Realigner(engine, store, 60).realign(product_id)
    again = await buy(client, token("before-loss"), product_id, key="after")
    assert again.status_code == 409 and again.json()["code"] == "limit_exceeded"  # quota rebuilt from MySQL
    assert (await buy(client, token("after-loss"), product_id)).status_code == 202
    assert await redis.get(keys.stock) == "3"


async def test_an_older_realignment_pass_never_writes_back_old_sale_terms(
    client, admin, engine, redis, store, settings, put_product, product_id
):
    """Guards: a slow realignment pass wrote back sale terms an operator had just changed."""
    await put_product(product_id, stock=5, limit=1)

    async def operator_closes_the_sale():
        body = {
            "stock": 5,
            "per_user_limit": 3,
            "sale_ends_at": "2020-01-02T00:00:00Z",
            "sale_starts_at": "2020-01-01T00:00:00Z",
        }
        assert (await client.put(f"/api/v1/admin/products/{product_id}", json=body, headers=admin)).status_code == 200

    older = Realigner(
        engine, open_stores(RunsAfterJournalRead(redis, operator_closes_the_sale), settings.redis.key_prefix), 60
    )
    assert (await older.realign(product_id)).skipped_stale
    terms = await redis.hgetall(store.product_keys(product_id).sale)
    assert (terms["limit"], terms["ends_ms"]) == ("3", "1577923200000")
