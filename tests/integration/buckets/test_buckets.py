"""Stock buckets on the real services: a hot product's stock split over K hash tags, each buyer in
one bucket for good, exact counts under a skewed stampede, dry buckets served by rebalancing."""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter

from redis.crc import key_slot

from service.adapters.redis.buckets import StockBuckets
from service.adapters.redis.stores import open_stores
from service.domain.stock import realign as realign_module
from service.domain.stock.buckets import bucket_of
from service.domain.stock.realign import Realigner
from service.model.stock import ReserveOutcome, ReserveRequest
from tests.support import buy, buy_and_settle, eventually, inventory, order_rows, quota_rows

K = 3


def users_in(bucket: int, count: int, prefix: str, buckets: int = K) -> list[str]:
    """``count`` user ids whose bucket among ``buckets`` is ``bucket``."""
    names = (f"{prefix}-{i}" for i in itertools.count())
    return list(itertools.islice((name for name in names if bucket_of(name, buckets) == bucket), count))


async def bucket_stocks(store, product_id: int) -> list[int | None]:
    return [stock for stock, _ in await store.buckets.states(product_id, K)]


async def test_each_bucket_has_its_own_slot_and_a_share_of_the_stock(client, put_product, product_id, store):
    report = await put_product(product_id, stock=31, limit=2, buckets=K)
    assert report["redis_stock_after"] == 31
    assert await bucket_stocks(store, product_id) == [11, 10, 10]
    slots = {key_slot(store.product_keys(product_id, bucket).stock.encode()) for bucket in range(K)}
    assert len(slots) == K
    view = (await client.get(f"/api/v1/products/{product_id}")).json()
    assert (view["buckets"], view["remaining"]) == (K, 31)


async def test_a_skewed_stampede_on_three_buckets_sells_exactly_the_stock(
    client, token, put_product, product_id, store, engine, consumer
):
    stock, limit = 120, 2
    await put_product(product_id, stock=stock, limit=limit, buckets=K)
    # Two thirds of the crowd in bucket 0: it runs dry long before the others.
    crowd = users_in(0, 400, "hot") + users_in(1, 100, "warm") + users_in(2, 100, "cold")
    asks = [(user, 1 + (i % 4 == 0), f"{user}-a") for i, user in enumerate(crowd)]
    asks += [(user, 1, f"{user}-b") for user in crowd[::3]]  # second purchases: the per-user limit
    responses = await asyncio.gather(*(buy(client, token(u), product_id, q, key=k) for u, q, k in asks))
    codes = Counter(r.status_code if r.status_code != 409 else r.json()["code"] for r in responses)
    assert set(codes) <= {202, "sold_out", "limit_exceeded", 503}, codes

    # Units a 503 ("rebalanced, retry") left behind are bought by fresh buyers of each bucket.
    accepted = [(u, q) for (u, q, _), r in zip(asks, responses, strict=True) if r.status_code == 202]
    fresh = {bucket: iter(users_in(bucket, 200, f"late{bucket}")) for bucket in range(K)}
    while sum(q for _, q in accepted) < stock:
        late = [next(fresh[bucket]) for bucket in range(K)]
        answers = await asyncio.gather(*(buy(client, token(user), product_id) for user in late))
        accepted += [(user, 1) for user, r in zip(late, answers, strict=True) if r.status_code == 202]
        assert all(r.status_code in (202, 409, 503) for r in answers)
        if all(r.status_code == 409 for r in answers):
            break

    assert sum(q for _, q in accepted) == stock
    held = Counter()
    for user, quantity in accepted:
        held[user] += quantity
    assert max(held.values()) <= limit
    rows = await eventually(lambda: _rows(engine, product_id, len(accepted)))
    assert Counter(row.status for row in rows) == {0: len(accepted)}  # none rejected for stock
    assert await inventory(engine, product_id) == (0, stock)
    assert await quota_rows(engine, product_id) == dict(held)
    assert await bucket_stocks(store, product_id) == [0, 0, 0]
    assert (await buy(client, token("after"), product_id)).json()["code"] == "sold_out"


async def _rows(engine, product_id, count):
    rows = await order_rows(engine, product_id)
    return rows if len(rows) >= count else None


async def test_a_buyer_whose_bucket_is_dry_is_served_from_the_others(
    client, token, put_product, product_id, store, engine, consumer
):
    await put_product(product_id, stock=6, limit=2, buckets=K)
    first, second, third = users_in(0, 3, "dry")
    for user in (first, second):
        assert (await buy(client, token(user), product_id)).status_code == 202
    assert await bucket_stocks(store, product_id) == [0, 2, 2]
    response = await buy(client, token(third), product_id)
    assert response.status_code == 202, response.text
    # The pass counted the two reservations in flight and shared the 4 units left.
    assert sum(stock or 0 for stock in await bucket_stocks(store, product_id)) == 3
    await eventually(lambda: _rows(engine, product_id, 3))
    assert await inventory(engine, product_id) == (3, 3)


async def test_a_cancelled_unit_goes_back_to_the_buyers_bucket(
    client, token, put_product, product_id, store, engine, consumer
):
    await put_product(product_id, stock=9, limit=1, buckets=K)
    [user] = users_in(2, 1, "canceller")
    [order_no] = await buy_and_settle(client, token, engine, product_id, [user])
    assert await bucket_stocks(store, product_id) == [3, 3, 2]
    cancelled = await client.post(f"/api/v1/orders/{order_no}/cancel", headers=token(user))
    assert cancelled.status_code == 200, cancelled.text
    assert await bucket_stocks(store, product_id) == [3, 3, 3]
    assert await store.stock.quota(product_id, buckets=K) == {}
    assert (await buy(client, token(user), product_id)).status_code == 202


async def test_a_lost_bucket_is_restored_with_its_replay_records(
    client, token, put_product, product_id, store, redis, engine, consumer, settings
):
    await put_product(product_id, stock=9, limit=1, buckets=K)
    [user] = users_in(1, 1, "lost")
    first = await buy(client, token(user), product_id, key="once")
    assert first.status_code == 202
    await eventually(lambda: _rows(engine, product_id, 1))
    lost = store.product_keys(product_id, 1)
    await redis.delete(*[key async for key in redis.scan_iter(match=f"{lost.tag}:*")])

    admin_token = token("admin", admin=True)
    realigned = await client.post(f"/api/v1/admin/realign?product_id={product_id}", headers=admin_token)
    assert realigned.status_code == 200, realigned.text
    assert sum(stock or 0 for stock in await bucket_stocks(store, product_id)) == 8
    again = await buy(client, token(user), product_id, key="once")
    assert (again.status_code, again.json()["order_no"]) == (202, first.json()["order_no"])
    assert (await buy(client, token(user), product_id, key="twice")).json()["code"] == "limit_exceeded"


async def test_the_bucket_count_is_fixed_and_a_caller_with_another_is_told(
    client, admin, put_product, product_id, store
):
    await put_product(product_id, stock=9, limit=1, buckets=K)
    body = {"stock": 9, "buckets": 2}
    refused = await client.put(f"/api/v1/admin/products/{product_id}", json=body, headers=admin)
    assert refused.status_code == 400
    assert "buckets" in refused.json()["detail"]
    assert (await client.put(f"/api/v1/admin/products/{product_id}", json={"stock": 12}, headers=admin)).is_success
    assert await bucket_stocks(store, product_id) == [4, 4, 4]

    reply = await store.reservations.reserve(
        ReserveRequest(product_id, "r-1", "someone", 1, "X", "attempt", bucket=0, buckets=1)
    )
    assert (reply.outcome, reply.buckets) == (ReserveOutcome.REBUCKET, K)
    assert await bucket_stocks(store, product_id) == [4, 4, 4]


async def _until_answered(client, token, user: str, product_id: int, quantity: int, tries: int = 20):
    """The buyer retries a ``503`` with the same Idempotency-Key, as docs/API.md asks."""
    for _ in range(tries):
        response = await buy(client, token(user), product_id, quantity, key=f"{user}-key")
        if response.status_code != 503:
            return response
        await asyncio.sleep(0.6)  # past the rebalancing pass's minimum interval
    return response


async def test_a_remainder_spread_thinner_than_asked_is_still_sold(
    client, token, put_product, product_id, store, engine, consumer
):
    # [1, 1, 1]: no bucket holds the 2 units a buyer asks for (the attack that found this had
    # buyers answered 503 on every retry, the units never sold).
    await put_product(product_id, stock=3, limit=2, buckets=K)
    assert await bucket_stocks(store, product_id) == [1, 1, 1]
    [user] = users_in(2, 1, "pair")
    response = await _until_answered(client, token, user, product_id, 2)
    assert response.status_code == 202, response.text
    assert sum(stock or 0 for stock in await bucket_stocks(store, product_id)) == 1
    [last] = users_in(0, 1, "last")
    assert (await _until_answered(client, token, last, product_id, 2)).json()["code"] == "sold_out"
    assert (await _until_answered(client, token, last, product_id, 1)).status_code == 202
    await eventually(lambda: _rows(engine, product_id, 2))
    assert await inventory(engine, product_id) == (0, 3)


async def test_buyers_of_one_bucket_buy_every_unit_the_others_hold(
    client, token, put_product, product_id, store, engine, consumer
):
    stock = 10
    await put_product(product_id, stock=stock, limit=1, buckets=K)
    crowd = users_in(2, 30, "one-bucket")
    answers = await asyncio.gather(*(_until_answered(client, token, user, product_id, 1) for user in crowd))
    codes = Counter(r.status_code if r.status_code != 409 else r.json()["code"] for r in answers)
    assert codes == {202: stock, "sold_out": len(crowd) - stock}, codes
    assert await bucket_stocks(store, product_id) == [0, 0, 0]
    await eventually(lambda: _rows(engine, product_id, stock))
    assert await inventory(engine, product_id) == (0, stock)


async def test_a_pass_over_every_product_leaves_a_locked_one_to_the_next(
    put_product, product_id, new_product_id, store, redis, engine, monkeypatch
):
    # A process killed while rebalancing holds the product's lock until it expires: the pass over
    # every product (realign --watch) goes on with the others instead of ending.
    monkeypatch.setattr(realign_module, "LOCK_WAIT_SECONDS", 0.2)
    other = new_product_id()
    await put_product(product_id, stock=9, limit=1, buckets=K)
    await put_product(other, stock=5, limit=1)
    assert await store.leases.lock(f"realign:{product_id}").acquire("a killed process", 60_000)
    await redis.set(store.product_keys(other).stock, 2)
    reports = {report.product_id: report for report in await Realigner(engine, store, grace_seconds=60).realign_all()}
    assert product_id not in reports
    assert (reports[other].drift, await store.stock.units(other)) == (-3, 5)


class _SlowFill(StockBuckets):
    """The real buckets on the real Redis; each bucket's fill waits first, so a rebalancing pass
    outlasts its lock's time to live several times over."""

    async def fill(self, *args, **kwargs):
        await asyncio.sleep(0.5)
        return await super().fill(*args, **kwargs)


async def test_a_long_pass_keeps_its_lock_and_a_dead_ones_lock_expires_quickly(
    put_product, product_id, redis, store, engine, settings, monkeypatch
):
    monkeypatch.setattr(realign_module, "LOCK_SECONDS", 0.3)
    await put_product(product_id, stock=9, limit=1, buckets=K)
    slow = open_stores(redis, settings.redis.key_prefix, replay_ttl_seconds=settings.orders.replay_ttl_seconds)
    slow.buckets = _SlowFill(redis, slow.scripts, slow.restocks, settings.redis.key_prefix)
    running = asyncio.create_task(Realigner(engine, slow, grace_seconds=60).realign(product_id))
    await asyncio.sleep(1.0)  # > 3 x the lock's time to live, the pass still filling
    assert not running.done()
    assert not await store.leases.lock(f"realign:{product_id}").acquire("another", 300)  # renewed, still held
    await running
    assert await bucket_stocks(store, product_id) == [3, 3, 3]
    # A holder that stops renewing (a killed process) loses it after one time to live.
    assert await store.leases.lock(f"realign:{product_id}").acquire("killed", 300)
    await asyncio.sleep(0.5)
    assert await store.leases.lock(f"realign:{product_id}").acquire("next", 300)
