"""Regression tests for what an adversarial review broke: each failed before its fix."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import jwt
import pytest
from sqlalchemy import text

from service.adapters.broker import OrderMessage, encode_order, queue_depth
from service.adapters.redis.stock_store import StockStore
from service.domain.order_no import compose_order_no
from service.domain.order_writer import apply_order
from service.domain.realign import Realigner
from service.domain.request_id import mint_request_id
from service.sale.isolation import environment, free_port
from tests.conftest import (
    RunsAfterJournalRead,
    eventually,
    inventory,
    order_rows,
    redis_state,
)
from tests.test_consumer import publish_raw
from tests.test_purchase import buy


async def test_setting_the_same_stock_again_mid_sale_does_not_oversell(client, token, put_product, product_id, engine, consumer):
    await put_product(product_id, stock=10, limit=1)
    first = await asyncio.gather(*(buy(client, token(f"a{i}"), product_id) for i in range(6)))
    assert all(r.status_code == 202 for r in first)
    await eventually(lambda: _rows(engine, product_id, 6))
    report = await put_product(product_id, stock=10, limit=1)
    assert (report["mysql_stock"], report["mysql_sold"], report["redis_stock_after"]) == (4, 6, 4)
    second = await asyncio.gather(*(buy(client, token(f"b{i}"), product_id) for i in range(10)))
    assert sum(r.status_code == 202 for r in second) == 4
    await eventually(lambda: _rows(engine, product_id, 10))
    assert await inventory(engine, product_id) == (0, 10)


async def _rows(engine, product_id, count):
    return len(await order_rows(engine, product_id)) >= count


async def test_an_older_realignment_pass_never_overwrites_a_newer_one(engine, redis, store, settings, put_product, product_id):
    await put_product(product_id, stock=10, limit=1)
    request_id = mint_request_id()
    order_no = compose_order_no("FS", "20261130000002", 95, product_id)
    reserved_at = (await store.reserve(product_id, request_id, "e", 1, order_no)).reserved_at_ms
    prefix = settings.redis.key_prefix

    async def consumer_commits_then_another_pass_runs():
        await apply_order(engine, OrderMessage(request_id, order_no, "e", product_id, 1, reserved_at, 1500))
        newer = await Realigner(engine, store, 60).realign(product_id)
        assert (newer.redis_stock_after, newer.resolved_dropped) == (9, 1)

    older = Realigner(engine, StockStore(RunsAfterJournalRead(redis, consumer_commits_then_another_pass_runs), prefix), 60)
    report = await older.realign(product_id)
    assert report.skipped_stale
    state = await redis_state(redis, settings, product_id)
    assert (state["stock"], state["journal"], state["quota"]) == ("9", {}, {"e": "1"})
    assert await inventory(engine, product_id) == (9, 1)


async def test_redis_data_loss_is_repaired_by_one_realignment(client, token, put_product, product_id, engine, redis, store, consumer):
    await put_product(product_id, stock=5, limit=1)
    assert (await buy(client, token("before-loss"), product_id)).status_code == 202
    await eventually(lambda: _rows(engine, product_id, 1))
    keys = store.product_keys(product_id)
    await redis.delete(keys.stock, keys.sale, keys.quota, keys.journal, keys.versions)
    assert (await buy(client, token("during-loss"), product_id)).status_code == 503

    await Realigner(engine, store, 60).realign(product_id)
    again = await buy(client, token("before-loss"), product_id, key="after")
    assert again.status_code == 409 and again.json()["code"] == "limit_exceeded"  # quota rebuilt from MySQL
    assert (await buy(client, token("after-loss"), product_id)).status_code == 202
    assert await redis.get(keys.stock) == "3"


async def test_values_with_a_trailing_newline_are_refused(client, token, settings, amqp_channel, put_product, product_id, engine, consumer):
    await put_product(product_id, stock=5, limit=1)
    good = compose_order_no("FS", "20261130000003", 94, 1)
    response = await client.get(f"/api/v1/orders/{good}%0A", headers=token("u"))
    assert response.status_code == 400 and response.json()["code"] == "invalid_order_no"
    now = int(time.time())
    newline_sub = jwt.encode({"sub": "mallory\n", "exp": now + 60, "iat": now}, settings.auth.jwt_secret, algorithm="HS256")
    assert (await client.get("/api/v1/orders", headers={"Authorization": f"Bearer {newline_sub}"})).status_code == 401

    dead_before = await queue_depth(amqp_channel, settings.amqp.dead_letter_queue)
    poison = OrderMessage(mint_request_id(), good + "\n", "zed", product_id, 1, 0, 1500)
    await publish_raw(amqp_channel, settings, encode_order(poison))
    after = OrderMessage(mint_request_id(), compose_order_no("FS", "20261130000003", 94, 2), "zed", product_id, 1, 0, 1500)
    await publish_raw(amqp_channel, settings, encode_order(after))
    await eventually(lambda: _rows(engine, product_id, 1))
    await eventually(lambda: _depth_above(amqp_channel, settings.amqp.dead_letter_queue, dead_before))


async def _depth_above(channel, queue, before):
    return await queue_depth(channel, queue) > before


async def _retry_after_the_replay_record_is_gone(client, headers, product_id, engine, redis, store, age_days: int):
    """Buy with a key, wait for the row, drop the replay record (and age the order by
    ``age_days``), retry with the same key; returns (first 202 body, retry 202 body, rows by order_no)."""
    first = (await buy(client, headers, product_id, key="k")).json()
    await eventually(lambda: _rows(engine, product_id, 1))
    await redis.delete(store.product_keys(product_id).replay(first["request_id"]))
    async with engine.begin() as conn:
        await conn.execute(
            text("UPDATE orders SET created_at = NOW() - INTERVAL :d DAY WHERE order_no = :o"),
            {"d": age_days, "o": first["order_no"]},
        )
    retry = (await buy(client, headers, product_id, key="k")).json()
    assert retry["order_no"] != first["order_no"]
    await eventually(lambda: _rows(engine, product_id, 2))
    return first, retry, {row.order_no: row for row in await order_rows(engine, product_id)}


async def test_key_reused_after_its_replay_record_expired_is_a_new_order_with_a_row(
    client, token, put_product, product_id, engine, redis, store, consumer
):
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
    await put_product(product_id, stock=5, limit=1)
    headers = token("unmarked")
    accepted = (await buy(client, headers, product_id, key="k")).json()
    keys = store.product_keys(product_id)
    await redis.hset(keys.replay(accepted["request_id"]), "state", "pending")  # as if the step was lost
    assert (await buy(client, headers, product_id, key="k")).status_code == 409
    await eventually(lambda: _rows(engine, product_id, 1))
    await Realigner(engine, store, 60).realign(product_id)
    replay = await buy(client, headers, product_id, key="k")
    assert replay.status_code == 202 and replay.json()["order_no"] == accepted["order_no"]


async def test_amounts_that_cannot_fit_bigint_and_ids_out_of_range_are_400(client, admin, new_product_id):
    pid = new_product_id()
    body = {"stock": 5, "price": 2**62, "per_user_limit": 2}
    response = await client.put(f"/api/v1/admin/products/{pid}", json=body, headers=admin)
    assert response.status_code == 400
    for bad in (2**63, 2**64, 0):
        assert (await client.put(f"/api/v1/admin/products/{bad}", json={"stock": 1}, headers=admin)).status_code == 400
        assert (await client.get(f"/api/v1/products/{bad}")).status_code in (400, 404)


async def test_deeply_nested_json_is_400(client, token):
    nested = b"[" * 100_000 + b"]" * 100_000
    response = await client.post("/api/v1/orders", content=nested, headers={**token("u"), "content-type": "application/json"})
    assert response.status_code == 400 and response.json()["code"] == "invalid_request"


async def test_a_killed_api_worker_is_replaced(settings):
    port = free_port()
    serve = subprocess.Popen(
        [str(Path(sys.executable).with_name("flashsale")), "serve", "--port", str(port), "--workers", "2"],
        env={**os.environ, **environment(settings)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}/api/v1/health/ready"

    async def ready():
        try:
            async with httpx.AsyncClient() as http:
                return (await http.get(url)).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        await eventually(ready, timeout=60, interval=0.25)
        workers = _children(serve.pid)
        assert len(workers) == 2
        os.kill(workers[0], signal.SIGKILL)
        await eventually(lambda: _replaced(serve.pid, workers[0]), timeout=60, interval=0.25)
        await eventually(ready, timeout=60, interval=0.25)
        assert serve.poll() is None
    finally:
        # SIGKILL: after a respawn granian's graceful stop can hang (the test is about the respawn).
        os.killpg(serve.pid, signal.SIGKILL)
        serve.wait()


def _children(pid: int) -> list[int]:
    found = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    return sorted(int(p) for p in found)


async def _replaced(pid: int, dead: int) -> bool:
    children = _children(pid)
    return len(children) == 2 and dead not in children


@pytest.mark.parametrize("value", ["1", 1.0, "1e0"])
async def test_quantity_of_the_wrong_type_is_refused(client, token, put_product, product_id, value, redis, settings):
    await put_product(product_id, stock=5, limit=2)
    response = await client.post("/api/v1/orders", json={"product_id": product_id, "quantity": value}, headers=token("typed"))
    assert response.status_code == 400 and response.json()["errors"][0]["field"] == "quantity"
    assert (await redis_state(redis, settings, product_id))["journal"] == {}


async def test_a_retry_after_redis_lost_its_replay_record_is_not_a_second_purchase(
    client, token, put_product, product_id, engine, redis, store, settings, consumer
):
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


async def test_an_older_realignment_pass_never_writes_back_old_sale_terms(
    client, admin, engine, redis, store, settings, put_product, product_id
):
    await put_product(product_id, stock=5, limit=1)

    async def operator_closes_the_sale():
        body = {"stock": 5, "per_user_limit": 3, "sale_ends_at": "2020-01-02T00:00:00Z", "sale_starts_at": "2020-01-01T00:00:00Z"}
        assert (await client.put(f"/api/v1/admin/products/{product_id}", json=body, headers=admin)).status_code == 200

    older = Realigner(engine, StockStore(RunsAfterJournalRead(redis, operator_closes_the_sale), settings.redis.key_prefix), 60)
    assert (await older.realign(product_id)).skipped_stale
    terms = await redis.hgetall(store.product_keys(product_id).sale)
    assert (terms["limit"], terms["ends_ms"]) == ("3", "1577923200000")


async def test_repeating_a_product_update_keeps_its_sale_window(client, admin, new_product_id):
    pid = new_product_id()
    scheduled = {"stock": 5, "sale_starts_at": "2030-01-01T00:00:00Z", "sale_ends_at": "2030-01-02T00:00:00Z"}
    assert (await client.put(f"/api/v1/admin/products/{pid}", json=scheduled, headers=admin)).status_code == 200
    assert (await client.put(f"/api/v1/admin/products/{pid}", json={"stock": 5}, headers=admin)).status_code == 200
    product = (await client.get(f"/api/v1/products/{pid}")).json()
    assert (product["sale_starts_at"], product["sale_ends_at"], product["sale_active"]) == (
        "2030-01-01T00:00:00Z", "2030-01-02T00:00:00Z", False
    )
    open_ended = await client.put(f"/api/v1/admin/products/{pid}", json={"stock": 5, "sale_ends_at": None}, headers=admin)
    assert open_ended.status_code == 200
    assert (await client.get(f"/api/v1/products/{pid}")).json()["sale_ends_at"] is None
    backwards = {"stock": 5, "sale_ends_at": "2029-12-31T00:00:00Z"}  # before the kept start
    response = await client.put(f"/api/v1/admin/products/{pid}", json=backwards, headers=admin)
    assert response.status_code == 400 and response.json()["errors"][0]["field"] == "sale_ends_at"
    assert (await client.get(f"/api/v1/products/{pid}")).json()["sale_ends_at"] is None
