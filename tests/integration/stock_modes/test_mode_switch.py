"""Switching a product's stock mode mid-sale, under load, in both directions: never an oversell,
every 201/202 exactly one order row, no user above the limit, all the stock sold (the
rollback plan of stock mode ``redis``, docs/OPERATIONS.md)."""

from __future__ import annotations

import asyncio
from collections import Counter

from db.models import OrderStatus
from service.domain.stock.realign import Realigner
from tests.support import api_in_loop, buy, eventually, inventory, order_rows, rows_at_least

STOCK = 200
LIMIT = 2
BUYERS = 300  # each wants LIMIT units: demand 600 for 200
FIRST = 30  # buyers before the switch (at most 60 units)
DURING = 60  # buyers arriving while the switch runs (at most 120 units: some are left after it)


async def _buyer(client, headers, product_id: int, answers: list) -> None:
    """Buys one unit at a time until the user holds the limit or is told no; ``503`` (the product
    is switching) is retried, as a client honouring ``Retry-After`` would."""
    bought = 0
    while bought < LIMIT:
        for _ in range(400):
            response = await buy(client, headers, product_id)
            if response.status_code != 503:
                break
            await asyncio.sleep(0.02)
        answers.append(response)
        if response.status_code not in (201, 202):
            return
        bought += 1


async def _sale_with_switch(settings, token, admin, product_id: int, to_mode: str) -> list:
    """``FIRST`` buyers buy in the product's mode; then an operator (another API process, with its
    own MySQL pool) switches it to ``to_mode`` while ``DURING`` buyers arrive over about half a
    second on the same API, so purchases are in flight on both sides of the switch; the rest
    arrive once it is done (however long it took on a loaded box), so both modes sell."""
    answers: list = []

    async def arriving(i: int) -> None:
        await asyncio.sleep((i - FIRST) * 0.008 if FIRST <= i < FIRST + DURING else 0)
        await _buyer(api, token(f"sw-{i}"), product_id, answers)

    async def switch() -> None:
        body = {"stock": STOCK, "per_user_limit": LIMIT, "price": 1500, "stock_mode": to_mode}
        switched = await operator.put(f"/api/v1/admin/products/{product_id}", json=body, headers=admin)
        assert switched.status_code == 200, switched.text

    async with api_in_loop(settings) as api, api_in_loop(settings, pool_size=2) as operator:
        first = [asyncio.create_task(arriving(i)) for i in range(FIRST)]
        tasks = first.copy()
        try:
            await asyncio.gather(*first)
            switching = asyncio.create_task(switch())
            tasks += [switching, *(asyncio.create_task(arriving(i)) for i in range(FIRST, FIRST + DURING))]
            await switching
            tasks += [asyncio.create_task(arriving(i)) for i in range(FIRST + DURING, BUYERS)]
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
    return answers


async def _check_exact(engine, product_id: int, answers: list) -> Counter:
    statuses = Counter(r.status_code for r in answers)
    accepted = [r.json()["order_no"] for r in answers if r.status_code in (201, 202)]
    assert len(accepted) == STOCK, statuses
    assert {r.json()["code"] for r in answers if r.status_code == 409} <= {"sold_out"}
    assert statuses[503] == 0  # every 503 was retried to a final answer
    await eventually(lambda: rows_at_least(engine, product_id, STOCK))
    await asyncio.sleep(0.3)  # a late extra row would show now
    rows = await order_rows(engine, product_id)
    assert sorted(r.order_no for r in rows) == sorted(accepted)  # each 201/202 exactly one row
    assert {r.status for r in rows} == {OrderStatus.PENDING_PAYMENT}
    assert await inventory(engine, product_id) == (0, STOCK)
    assert max(Counter(r.user_id for r in rows).values()) <= LIMIT
    return statuses


async def test_redis_to_database_mid_sale_sells_exactly_the_stock(
    settings, client, token, admin, put_product, product_id, engine, store, consumer
):
    await put_product(product_id, stock=STOCK, limit=LIMIT, stock_mode="redis")
    answers = await _sale_with_switch(settings, token, admin, product_id, "database")
    statuses = await _check_exact(engine, product_id, answers)
    assert statuses[202] > 0 and statuses[201] > 0, statuses  # both modes sold
    info = (await client.get(f"/api/v1/products/{product_id}")).json()
    assert (info["stock_mode"], info["remaining"]) == ("database", 0)
    assert await store.stock.journal(product_id) == []  # every reservation landed before MySQL served


async def test_database_to_redis_mid_sale_sells_exactly_the_stock(
    settings, token, admin, put_product, product_id, engine, store, redis, consumer
):
    await put_product(product_id, stock=STOCK, limit=LIMIT, stock_mode="database")
    answers = await _sale_with_switch(settings, token, admin, product_id, "redis")
    statuses = await _check_exact(engine, product_id, answers)
    assert statuses[201] > 0 and statuses[202] > 0, statuses
    report = await Realigner(engine, store, 60).realign(product_id)
    assert (report.redis_stock_after, report.in_flight, report.drift) == (0, 0, 0)
    assert "mode" not in await redis.hgetall(store.product_keys(product_id).sale)


async def test_a_retry_answered_in_database_mode_replays_after_the_switch_to_redis(
    client, token, put_product, product_id, engine, consumer
):
    """The same Idempotency-Key (or Order-Token) after a switch to ``redis`` answers the order
    it made in ``database`` mode: same order number, no second order, no unit taken twice."""
    await put_product(product_id, stock=10, limit=2, stock_mode="database")
    first = await buy(client, token("replayer"), product_id, key="K-1")
    assert first.status_code == 201, first.text
    tokened = await client.post("/api/v1/orders/tokens", json={"product_id": product_id}, headers=token("replayer"))
    order_token = tokened.json()["token"]
    headers = {**token("replayer"), "Order-Token": order_token}
    body = {"product_id": product_id, "quantity": 1}
    with_token = await client.post("/api/v1/orders", json=body, headers=headers)
    assert with_token.status_code == 201, with_token.text

    await put_product(product_id, stock=10, limit=2, stock_mode="redis")
    again = await buy(client, token("replayer"), product_id, key="K-1")
    assert again.status_code == 202, again.text
    assert again.json()["order_no"] == first.json()["order_no"]
    assert again.json()["request_id"] == first.json()["request_id"]
    token_again = await client.post("/api/v1/orders", json=body, headers=headers)
    assert (token_again.status_code, token_again.json()["order_no"]) == (202, with_token.json()["order_no"])
    reused = await buy(client, token("replayer"), product_id, quantity=2, key="K-1")
    assert reused.status_code == 422 and reused.json()["code"] == "idempotency_key_reused"
    assert len(await order_rows(engine, product_id)) == 2
    assert (await inventory(engine, product_id))[:2] == (8, 2)
