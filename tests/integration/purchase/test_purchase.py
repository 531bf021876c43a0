"""The purchase path on the real services: exact counts under real concurrency."""

from __future__ import annotations

import asyncio
from collections import Counter

from sqlalchemy import text

from service.domain.order_numbers.format import is_valid_order_no
from service.domain.stock.realign import Realigner
from tests.support import (
    buy,
    eventually,
    inventory,
    order_rows,
    redis_state,
    rows_at_least,
    sampling_min_stock,
)


async def test_200_concurrent_buyers_for_stock_10_get_exactly_10_orders(
    client, token, put_product, product_id, redis, store, engine, consumer
):
    await put_product(product_id, stock=10, limit=1)
    headers = [token(f"buyer{i}") for i in range(200)]
    stock_key = store.product_keys(product_id).stock

    async with sampling_min_stock(redis, stock_key) as minimum:
        responses = await asyncio.gather(*(buy(client, h, product_id) for h in headers))

    statuses = Counter(r.status_code for r in responses)
    assert statuses == {202: 10, 409: 190}
    assert Counter(r.json()["code"] for r in responses if r.status_code == 409) == {"sold_out": 190}
    assert minimum[0] == 0
    assert await redis.get(stock_key) == "0"
    accepted = {r.json()["order_no"] for r in responses if r.status_code == 202}
    assert len(accepted) == 10 and all(is_valid_order_no(o) for o in accepted)
    for r in responses:
        if r.status_code == 202:
            assert r.headers["location"] == f"/api/v1/orders/{r.json()['order_no']}"

    rows = await eventually(lambda: _rows_when(engine, product_id, 10))
    assert {row.order_no for row in rows} == accepted
    assert all(row.status == 0 for row in rows)
    assert await inventory(engine, product_id) == (0, 10)


async def _rows_when(engine, product_id, count):
    rows = await order_rows(engine, product_id)
    return rows if len(rows) >= count else None


async def test_one_user_20_concurrent_keys_at_limit_1_gets_exactly_one(
    client, token, put_product, product_id, redis, settings
):
    await put_product(product_id, stock=100, limit=1)
    headers = token("greedy")
    responses = await asyncio.gather(*(buy(client, headers, product_id, key=f"k-{i}") for i in range(20)))
    assert Counter(r.status_code for r in responses) == {202: 1, 409: 19}
    assert {r.json()["code"] for r in responses if r.status_code == 409} == {"limit_exceeded"}
    state = await redis_state(redis, settings, product_id)
    assert state["stock"] == "99"
    assert state["quota"] == {"greedy": "1"}
    assert len(state["journal"]) == 1


async def test_10_concurrent_requests_with_one_key_make_one_order_and_no_5xx(
    client, token, put_product, product_id, engine, consumer
):
    await put_product(product_id, stock=5, limit=3)
    headers = token("retrier")
    responses = await asyncio.gather(*(buy(client, headers, product_id, key="same-key") for _ in range(10)))
    statuses = Counter(r.status_code for r in responses)
    assert set(statuses) <= {202, 409} and statuses[202] >= 1
    assert {r.json()["code"] for r in responses if r.status_code == 409} <= {"request_in_progress"}
    order_nos = {r.json()["order_no"] for r in responses if r.status_code == 202}
    assert len(order_nos) == 1

    replay = await buy(client, headers, product_id, key="same-key")
    assert replay.status_code == 202 and replay.json()["order_no"] in order_nos
    rows = await eventually(lambda: _rows_when(engine, product_id, 1))
    await asyncio.sleep(0.3)
    assert len(await order_rows(engine, product_id)) == 1
    assert rows[0].order_no in order_nos
    assert await inventory(engine, product_id) == (4, 1)


async def test_same_key_different_body_is_422_and_changes_nothing(
    client, token, put_product, product_id, redis, settings
):
    await put_product(product_id, stock=5, limit=3)
    headers = token("changer")
    first = await buy(client, headers, product_id, quantity=1, key="k")
    assert first.status_code == 202
    before = await redis_state(redis, settings, product_id)
    second = await buy(client, headers, product_id, quantity=2, key="k")
    assert second.status_code == 422 and second.json()["code"] == "idempotency_key_reused"
    assert await redis_state(redis, settings, product_id) == before


async def test_key_is_scoped_to_the_user(client, token, put_product, product_id):
    await put_product(product_id, stock=5, limit=1)
    a = await buy(client, token("ann"), product_id, key="shared")
    b = await buy(client, token("bob"), product_id, key="shared")
    assert a.status_code == b.status_code == 202
    assert a.json()["request_id"] != b.json()["request_id"]
    assert a.json()["order_no"] != b.json()["order_no"]


async def test_sale_not_started_never_decrements(client, token, put_product, product_id, redis, settings):
    await put_product(product_id, stock=5, limit=1, sale_starts_at="2099-01-01T00:00:00Z")
    before = await redis_state(redis, settings, product_id)
    response = await buy(client, token("early"), product_id)
    assert response.status_code == 409 and response.json()["code"] == "sale_not_active"
    assert await redis_state(redis, settings, product_id) == before
    assert before["stock"] == "5"


async def test_sale_ended_is_not_active(client, token, put_product, product_id):
    await put_product(
        product_id, stock=5, limit=1, sale_starts_at="2020-01-01T00:00:00Z", sale_ends_at="2020-01-02T00:00:00Z"
    )
    response = await buy(client, token("late"), product_id)
    assert response.status_code == 409 and response.json()["code"] == "sale_not_active"


async def test_stock_not_loaded_is_not_sold_out_and_writes_nothing(
    client, token, put_product, product_id, redis, store
):
    await put_product(product_id, stock=5, limit=1)
    keys = store.product_keys(product_id)
    await redis.delete(keys.stock)
    response = await buy(client, token("someone"), product_id)
    assert response.status_code == 503 and response.json()["code"] == "unavailable"
    assert response.headers["retry-after"]
    assert await redis.get(keys.stock) is None
    assert await redis.hgetall(keys.journal) == {}


async def test_order_reads_back_queued_then_from_mysql_and_only_for_its_owner(
    client, token, put_product, product_id, consumer, engine
):
    await put_product(product_id, stock=5, limit=1)
    owner = token("owner")
    accepted = (await buy(client, owner, product_id)).json()
    path = f"/api/v1/orders/{accepted['order_no']}"

    async def pending_payment():
        body = (await client.get(path, headers=owner)).json()
        return body if body["status"] == "pending_payment" else None

    body = await eventually(pending_payment)
    assert body["amount"] == 1500 and body["quantity"] == 1
    other = await client.get(path, headers=token("stranger"))
    assert other.status_code == 404 and other.json()["code"] == "order_not_found"


async def test_order_read_while_only_redis_knows_it_is_queued(client, token, put_product, product_id):
    await put_product(product_id, stock=5, limit=1)
    owner = token("early-reader")
    accepted = (await buy(client, owner, product_id)).json()
    # No consumer runs in this test: only Redis knows the order.
    response = await client.get(f"/api/v1/orders/{accepted['order_no']}", headers=owner)
    assert response.status_code == 200
    assert response.json()["status"] == "queued" and response.json()["quantity"] == 1


# Regression tests from the adversarial review.


async def _retry_after_the_replay_record_is_gone(client, headers, product_id, engine, redis, store, age_days: int):
    """Buy with a key, wait for the row, drop the replay record (and age the order by
    ``age_days``), retry with the same key; returns (first 202 body, retry 202 body, rows by order_no)."""
    first = (await buy(client, headers, product_id, key="k")).json()
    await eventually(lambda: rows_at_least(engine, product_id, 1))
    await redis.delete(store.product_keys(product_id).replay(first["request_id"]))
    async with engine.begin() as conn:
        await conn.execute(
            text("UPDATE orders SET created_at = NOW() - INTERVAL :d DAY WHERE order_no = :o"),
            {"d": age_days, "o": first["order_no"]},
        )
    retry = (await buy(client, headers, product_id, key="k")).json()
    assert retry["order_no"] != first["order_no"]
    await eventually(lambda: rows_at_least(engine, product_id, 2))
    return first, retry, {row.order_no: row for row in await order_rows(engine, product_id)}


async def test_key_reused_after_its_replay_record_expired_is_a_new_order_with_a_row(
    client, token, put_product, product_id, engine, redis, store, consumer
):
    """Guards: a key reused after its replay window was treated as a duplicate and its order got no row."""
    await put_product(product_id, stock=5, limit=2)
    # Two days old: past the 24 h replay window, so the reused key is a new purchase.
    first, second, rows = await _retry_after_the_replay_record_is_gone(
        client, token("forgetful"), product_id, engine, redis, store, age_days=2
    )
    assert (rows[first["order_no"]].status, rows[second["order_no"]].status) == (0, 0)
    report = await Realigner(engine, store, 60).realign(product_id)
    assert (report.mysql_stock, report.redis_stock_after, report.in_flight) == (3, 3, 0)
    assert await redis.hget(store.product_keys(product_id).quota, "forgetful") == "2"


async def test_a_lost_mark_queued_step_becomes_a_replay_once_realigned(
    client, token, put_product, product_id, engine, redis, store, consumer
):
    """Guards: a replay record stuck in "pending" (lost mark-queued step) answered 409 forever."""
    await put_product(product_id, stock=5, limit=1)
    headers = token("unmarked")
    accepted = (await buy(client, headers, product_id, key="k")).json()
    keys = store.product_keys(product_id)
    await redis.hset(keys.replay(accepted["request_id"]), "state", "pending")  # as if the step was lost
    assert (await buy(client, headers, product_id, key="k")).status_code == 409
    await eventually(lambda: rows_at_least(engine, product_id, 1))
    await Realigner(engine, store, 60).realign(product_id)
    replay = await buy(client, headers, product_id, key="k")
    assert replay.status_code == 202 and replay.json()["order_no"] == accepted["order_no"]


async def test_a_retry_after_redis_lost_its_replay_record_is_not_a_second_purchase(
    client, token, put_product, product_id, engine, redis, store, settings, consumer
):
    """Guards: a retry after Redis lost a fresh replay record was sold twice."""
    await put_product(product_id, stock=5, limit=2)
    # Fresh order: the record should still exist, so Redis lost it and this is the same request.
    first, retry, rows = await _retry_after_the_replay_record_is_gone(
        client, token("lost-record"), product_id, engine, redis, store, age_days=0
    )
    assert (rows[first["order_no"]].status, rows[retry["order_no"]].status) == (0, 7)
    assert rows[retry["order_no"]].reason == "duplicate_request"
    assert await inventory(engine, product_id) == (4, 1)
    await Realigner(engine, store, 60).realign(product_id)
    assert (await redis_state(redis, settings, product_id))["stock"] == "4"
    assert await redis.hget(store.product_keys(product_id).quota, "lost-record") == "1"
