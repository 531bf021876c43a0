"""Server-issued order tokens (the anti-duplicate token,
``SET token EX 300`` when the order page opens, deleted atomically on submit)."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from tests.support import api_in_loop, eventually, inventory, order_rows, redis_state, rows_at_least


async def _token(client, headers, product_id: int) -> str:
    answer = await client.post("/api/v1/orders/tokens", json={"product_id": product_id}, headers=headers)
    assert answer.status_code == 201, answer.text
    body = answer.json()
    assert body["expires_in"] == 300 and len(body["token"]) == 32
    return body["token"]


async def _submit(client, headers, product_id: int, order_token: str | None, quantity: int = 1):
    if order_token is not None:
        headers = {**headers, "Order-Token": order_token}
    return await client.post("/api/v1/orders", json={"product_id": product_id, "quantity": quantity}, headers=headers)


async def test_a_token_is_kept_in_the_products_slot_for_300_seconds(
    client, token, put_product, product_id, redis, store
):
    await put_product(product_id, stock=5, limit=1, require_token=True)
    issued = await _token(client, token("tok-a"), product_id)
    key = store.product_keys(product_id).order_token(issued)
    assert await redis.get(key) == "tok-a"
    assert 290 < await redis.ttl(key) <= 300
    missing = await client.post("/api/v1/orders/tokens", json={"product_id": product_id + 10_000}, headers=token("x"))
    assert (missing.status_code, missing.json()["code"]) == (404, "product_not_found")


@pytest.mark.parametrize("mode", ["redis", "database"])
async def test_missing_unknown_expired_or_foreign_tokens_are_refused_without_a_trace(
    client, token, put_product, new_product_id, redis, store, settings, engine, mode
):
    product_id = new_product_id()
    await put_product(product_id, stock=5, limit=1, require_token=True, stock_mode=mode)
    before = await redis_state(redis, settings, product_id)
    buyer = token("tok-b")

    answer = await _submit(client, buyer, product_id, None)
    assert (answer.status_code, answer.json()["code"]) == (428, "token_required")
    for bad in ("never-issued", "x" * 65):
        answer = await _submit(client, buyer, product_id, bad)
        assert (answer.status_code, answer.json()["code"]) == (409, "token_invalid")
    someone_elses = await _token(client, token("tok-other"), product_id)
    answer = await _submit(client, buyer, product_id, someone_elses)
    assert (answer.status_code, answer.json()["code"]) == (409, "token_invalid")
    expired = await _token(client, buyer, product_id)
    await redis.delete(store.product_keys(product_id).order_token(expired))  # what EX 300 does later
    answer = await _submit(client, buyer, product_id, expired)
    assert (answer.status_code, answer.json()["code"]) == (409, "token_invalid")

    after = await redis_state(redis, settings, product_id)
    assert (after["stock"], after["journal"], after["quota"]) == (before["stock"], before["journal"], before["quota"])
    assert await order_rows(engine, product_id) == []
    assert await inventory(engine, product_id) == (5, 0)
    assert await redis.get(store.product_keys(product_id).order_token(someone_elses)) == "tok-other"  # untouched


@pytest.mark.parametrize(("mode", "status"), [("redis", 202), ("database", 201)])
async def test_only_the_first_submission_of_a_token_buys_and_a_second_answers_it_again(
    settings, client, token, put_product, new_product_id, redis, store, engine, consumer, mode, status
):
    product_id = new_product_id()
    await put_product(product_id, stock=10, limit=2, require_token=True, stock_mode=mode)
    buyer = token("tok-c")
    issued = await _token(client, buyer, product_id)
    async with api_in_loop(settings) as api:
        together = await asyncio.gather(*(_submit(api, buyer, product_id, issued) for _ in range(50)))
    statuses = Counter(r.status_code for r in together)
    assert set(statuses) <= {status, 409} and statuses[status] >= 1, statuses
    assert {r.json()["code"] for r in together if r.status_code == 409} <= {"request_in_progress"}
    order_nos = {r.json()["order_no"] for r in together if r.status_code == status}
    assert len(order_nos) == 1
    consumed = await redis.get(store.product_keys(product_id).order_token(issued))
    assert consumed == (None if mode == "redis" else "used:tok-c")  # deleted by reserve.lua / marked used

    again = await _submit(client, buyer, product_id, issued)
    assert (again.status_code, again.json()["order_no"]) == (status, order_nos.pop())
    await eventually(lambda: rows_at_least(engine, product_id, 1))
    await asyncio.sleep(0.2)  # a second row would show now
    rows = await order_rows(engine, product_id)
    assert len(rows) == 1 and rows[0].user_id == "tok-c"
    second = await _token(client, buyer, product_id)  # a new order page: a new purchase
    assert (await _submit(client, buyer, product_id, second)).status_code == status


async def test_a_database_mode_rejection_gives_the_token_back(client, token, put_product, product_id, redis, store):
    await put_product(product_id, stock=0, limit=1, require_token=True, stock_mode="database")
    buyer = token("tok-d")
    issued = await _token(client, buyer, product_id)
    answer = await _submit(client, buyer, product_id, issued)
    assert (answer.status_code, answer.json()["code"]) == (409, "sold_out")
    key = store.product_keys(product_id).order_token(issued)
    assert await redis.get(key) == "tok-d" and await redis.ttl(key) > 0


async def test_a_process_that_knew_the_product_before_require_token_changed_answers_the_new_rule(
    client, token, put_product, product_id, redis, store
):
    """The API process keeps each product's route; turning require_token on or off is honoured
    at once all the same (the transaction reads the rule; a refusal refreshes the route)."""
    buyer = token("tok-e")
    await put_product(product_id, stock=5, limit=3, stock_mode="database")
    assert (await _submit(client, buyer, product_id, None)).status_code == 201  # kept: no token needed
    await put_product(product_id, stock=5, limit=3, stock_mode="database", require_token=True)
    answer = await _submit(client, buyer, product_id, None)
    assert (answer.status_code, answer.json()["code"]) == (428, "token_required")  # kept: token needed
    await put_product(product_id, stock=5, limit=3, stock_mode="database", require_token=False)
    assert (await _submit(client, buyer, product_id, None)).status_code == 201  # kept: no token needed
    await put_product(product_id, stock=5, limit=3, stock_mode="database", require_token=True)
    issued = await _token(client, buyer, product_id)
    assert (await _submit(client, buyer, product_id, issued)).status_code == 201
    assert await redis.get(store.product_keys(product_id).order_token(issued)) == "used:tok-e"
