"""Stock mode ``database`` (docs/ARCHITECTURE.md, stock modes): one MySQL
transaction per purchase, ``201`` with the order ``pending_payment``; exact under concurrency."""

from __future__ import annotations

import asyncio
from collections import Counter
from datetime import UTC, datetime, timedelta

from sqlalchemy import text

from db.models import OrderStatus
from service.domain.order_numbers.format import compose_order_no, is_valid_order_no
from service.domain.purchase.database_transaction import DatabasePurchase, buy_in_database
from service.domain.purchase.request_id import mint_request_id
from service.model.stock import ReserveOutcome
from tests.support import api_in_loop, behind_a_row_lock, buy, inventory, order_rows, redis_state


async def _history(engine, order_no: str) -> list:
    async with engine.connect() as conn:
        return list(
            await conn.execute(
                text(
                    "SELECT l.from_status, l.to_status FROM order_status_log l JOIN orders o ON o.id = l.order_id"
                    " WHERE o.order_no = :o ORDER BY l.id"
                ),
                {"o": order_no},
            )
        )


async def test_new_products_default_to_database_mode_and_answer_201_pending_payment(
    client, token, admin, product_id, engine, redis, settings
):
    body = {"stock": 3, "per_user_limit": 2, "price": 1500}
    assert (await client.put(f"/api/v1/admin/products/{product_id}", json=body, headers=admin)).status_code == 200
    info = (await client.get(f"/api/v1/products/{product_id}")).json()
    assert (info["stock_mode"], info["require_token"], info["remaining"]) == ("database", False, 3)

    response = await buy(client, token("db-buyer"), product_id, quantity=2)
    assert response.status_code == 201, response.text
    order = response.json()
    assert order["status"] == "pending_payment" and is_valid_order_no(order["order_no"])
    assert response.headers["location"] == f"/api/v1/orders/{order['order_no']}"
    rows = await order_rows(engine, product_id)
    assert [(r.order_no, r.user_id, r.quantity, r.status) for r in rows] == [
        (order["order_no"], "db-buyer", 2, OrderStatus.PENDING_PAYMENT)
    ]
    assert await inventory(engine, product_id) == (1, 2)
    assert [tuple(h) for h in await _history(engine, order["order_no"])] == [(None, OrderStatus.PENDING_PAYMENT)]
    # Nothing of the purchase in Redis: no journal entry, no quota, no replay record.
    state = await redis_state(redis, settings, product_id)
    assert state["journal"] == {} and state["quota"] == {}
    assert not [key for key in state["keys"] if ":req:" in key]
    read = await client.get(f"/api/v1/orders/{order['order_no']}", headers=token("db-buyer"))
    assert read.status_code == 200 and read.json()["status"] == "pending_payment"
    assert (await client.get(f"/api/v1/products/{product_id}")).json()["remaining"] == 1


async def test_replays_answer_the_same_order_and_a_changed_body_is_422(
    settings, client, token, put_product, product_id, engine
):
    await put_product(product_id, stock=5, limit=3, stock_mode="database")
    headers = token("db-retrier")
    async with api_in_loop(settings) as api:
        together = await asyncio.gather(*(buy(api, headers, product_id, key="k1") for _ in range(20)))
    assert {r.status_code for r in together} == {201}
    first = together[0]
    again = await asyncio.gather(*(buy(client, headers, product_id, key="k1") for _ in range(3)))
    assert {(r.status_code, r.json()["order_no"]) for r in again} == {(201, first.json()["order_no"])}
    changed = await buy(client, headers, product_id, quantity=2, key="k1")
    assert (changed.status_code, changed.json()["code"]) == (422, "idempotency_key_reused")
    assert len(await order_rows(engine, product_id)) == 1
    assert await inventory(engine, product_id) == (4, 1)


async def test_rejections_write_nothing(client, token, put_product, new_product_id, engine):
    sold_out, limited, closed = new_product_id(), new_product_id(), new_product_id()
    await put_product(sold_out, stock=1, limit=1, stock_mode="database")
    await put_product(limited, stock=10, limit=1, stock_mode="database")
    later = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    await put_product(closed, stock=10, limit=1, stock_mode="database", sale_starts_at=later)

    assert (await buy(client, token("a"), sold_out)).status_code == 201
    answer = await buy(client, token("b"), sold_out)
    assert (answer.status_code, answer.json()["code"]) == (409, "sold_out")
    assert (await buy(client, token("a"), limited)).status_code == 201
    answer = await buy(client, token("a"), limited)
    assert (answer.status_code, answer.json()["code"]) == (409, "limit_exceeded")
    answer = await buy(client, token("b"), limited, quantity=2)
    assert (answer.status_code, answer.json()["code"]) == (400, "invalid_request")
    answer = await buy(client, token("a"), closed)
    assert (answer.status_code, answer.json()["code"]) == (409, "sale_not_active")

    assert await inventory(engine, sold_out) == (0, 1) and len(await order_rows(engine, sold_out)) == 1
    assert await inventory(engine, limited) == (9, 1) and len(await order_rows(engine, limited)) == 1
    assert await inventory(engine, closed) == (10, 0) and await order_rows(engine, closed) == []


async def test_300_concurrent_buyers_for_50_units_sell_exactly_50(settings, token, put_product, product_id, engine):
    await put_product(product_id, stock=50, limit=2, stock_mode="database")
    headers = [token(f"crowd-{i % 150}") for i in range(300)]  # 150 buyers, two requests each
    async with api_in_loop(settings) as api:
        responses = await asyncio.gather(*(buy(api, h, product_id) for h in headers))

    statuses = Counter(r.status_code for r in responses)
    assert statuses[201] == 50 and statuses[201] + statuses[409] == 300, statuses
    assert {r.json()["code"] for r in responses if r.status_code == 409} <= {"sold_out", "limit_exceeded"}
    rows = await order_rows(engine, product_id)
    assert sorted(r.order_no for r in rows) == sorted(r.json()["order_no"] for r in responses if r.status_code == 201)
    assert {r.status for r in rows} == {OrderStatus.PENDING_PAYMENT}
    assert await inventory(engine, product_id) == (0, 50)
    assert max(Counter(r.user_id for r in rows).values()) <= 2


async def test_per_user_limit_is_exact_under_concurrency(settings, token, put_product, product_id, engine):
    await put_product(product_id, stock=1000, limit=3, stock_mode="database")
    headers = [token(f"greedy-{i % 40}") for i in range(320)]  # 40 buyers, eight requests each
    async with api_in_loop(settings) as api:
        responses = await asyncio.gather(*(buy(api, h, product_id) for h in headers))

    statuses = Counter(r.status_code for r in responses)
    assert statuses == {201: 120, 409: 200}, statuses
    assert {r.json()["code"] for r in responses if r.status_code == 409} == {"limit_exceeded"}
    rows = await order_rows(engine, product_id)
    assert Counter(r.user_id for r in rows) == {f"greedy-{i}": 3 for i in range(40)}
    assert await inventory(engine, product_id) == (880, 120)


async def test_a_lock_wait_timeout_retries_the_whole_purchase(settings, engine, put_product, product_id):
    await put_product(product_id, stock=3, limit=1, stock_mode="database")
    order_no = compose_order_no("FS", "20261130000000", 98, 1)
    purchase = DatabasePurchase("waiter", product_id, 1, mint_request_id(), order_no)
    answer, timeouts = await behind_a_row_lock(settings, engine, product_id, lambda e: buy_in_database(e, purchase))
    assert (answer.outcome, answer.order_no) == (ReserveOutcome.RESERVED, order_no)
    assert timeouts >= 1  # the first attempt hit 1205; a retry bought
    assert await inventory(engine, product_id) == (2, 1)
    assert [r.order_no for r in await order_rows(engine, product_id)] == [order_no]
