"""The service heals by itself (docs/RELIABILITY.md): Redis data loss mid-sale and stranded
reservations are repaired by the API's own recovery task, nobody runs ``flashsale realign``.

Each test runs the real API (in process, its lifespan and recovery task included), the real
consumer and a Redis server of its own (``private_redis``: FLUSHALL is done to it, never to the
shared one), with queues of its own; MySQL is the run's database."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter

from service.adapters.redis.client import make_redis
from service.adapters.redis.reservations import new_attempt
from service.adapters.redis.stores import open_stores
from service.api.app import create_app
from service.domain.order_numbers.format import compose_order_no
from service.domain.purchase.request_id import mint_request_id
from service.domain.stock.recovery import LOCK_SECONDS
from service.model.stock import ReserveRequest
from tests.support import (
    PATIENCE,
    buy,
    eventually,
    inventory,
    order_rows,
    own_queues,
    private_redis,
    running_consumer,
    serving,
)


@contextlib.asynccontextmanager
async def _healing_service(settings, engine, name: str):
    """(settings, api client, store, raw redis) of an API with its recovery task every 0.5 s
    and a 1 s grace period, a consumer, a private Redis and queues of their own."""
    async with private_redis() as url, own_queues(settings, name) as queued:
        own = queued.model_copy(
            update={
                "redis": queued.redis.model_copy(update={"url": url}),
                "realign": queued.realign.model_copy(update={"auto_seconds": 0.5, "grace_seconds": 1.0}),
            }
        )
        redis = make_redis(own)
        store = open_stores(redis, own.redis.key_prefix)
        try:
            async with serving(create_app(own), timeout=30) as api, running_consumer(own, engine, store):
                yield own, api, store, redis
        finally:
            await redis.aclose()


async def test_a_flushall_mid_sale_is_repaired_without_anyone_running_realignment(
    settings, engine, token, admin, product_id
):
    stock, buyers = 60, 200
    async with _healing_service(settings, engine, "flush") as (own, api, store, redis):
        body = {"stock": stock, "per_user_limit": 1, "price": 1500, "stock_mode": "redis"}
        assert (await api.put(f"/api/v1/admin/products/{product_id}", json=body, headers=admin)).status_code == 200
        accepted: list[dict] = []
        answers: Counter[int] = Counter()
        flushed_after = -1
        bound = asyncio.Semaphore(25)

        async def buyer(user: int) -> None:
            """One purchase with a key; a 503 is retried with the same key, as clients do."""
            async with bound:
                for _ in range(400):
                    response = await buy(api, token(f"heal-{user}"), product_id, key=f"k-{user}")
                    answers[response.status_code] += 1
                    if response.status_code != 503:
                        if response.status_code == 202:
                            accepted.append(response.json())
                        return
                    await asyncio.sleep(0.05)
                raise AssertionError(f"buyer {user} still answered 503 after 400 tries")

        async def flush_mid_sale() -> None:
            nonlocal flushed_after
            await eventually(lambda: asyncio.sleep(0, len(accepted) >= stock // 3), interval=0.001)
            flushed_after = len(accepted)
            await redis.flushall()

        async with asyncio.timeout(PATIENCE * 3):  # a hung purchase fails the test, not the suite
            await asyncio.gather(flush_mid_sale(), *(buyer(user) for user in range(buyers)))
        assert 0 < flushed_after < len(accepted), "the flush did not land mid-sale"
        assert answers[503] > 0  # the loss was seen...

        # ... and healed: every buyer got a final answer; every 202 gets exactly one row.
        await eventually(lambda: _rows_for(engine, product_id, accepted))
        rows = await order_rows(engine, product_id)
        assert Counter(row.order_no for row in rows).most_common(1)[0][1] == 1
        assert Counter(row.request_id for row in rows).most_common(1)[0][1] == 1
        assert len({a["order_no"] for a in accepted}) == len(accepted)
        assert {a["order_no"] for a in accepted} == {row.order_no for row in rows}
        assert await inventory(engine, product_id) == (0, stock)  # sold = stock, none oversold


async def _rows_for(engine, product_id: int, accepted: list[dict]) -> bool:
    return len(await order_rows(engine, product_id)) >= len(accepted)


async def test_readiness_says_redis_is_being_repaired_until_the_pass_reloads_the_product(
    settings, engine, token, admin, product_id
):
    async with _healing_service(settings, engine, "ready") as (own, api, store, redis):
        body = {"stock": 5, "per_user_limit": 1, "price": 1500, "stock_mode": "redis"}
        assert (await api.put(f"/api/v1/admin/products/{product_id}", json=body, headers=admin)).status_code == 200
        assert (await api.get("/api/v1/health/ready")).json()["redis_state"] == "ok"
        await redis.flushall()
        # Another process's pass holds the recovery lock (and does not get to this product yet).
        assert await store.leases.lock("recovery").acquire("someone-else", LOCK_SECONDS * 1000)
        assert (await buy(api, token("r1"), product_id)).status_code == 503
        ready = await api.get("/api/v1/health/ready")
        assert (ready.status_code, ready.json()["redis_state"]) == (503, "being repaired")
        await store.leases.lock("recovery").release("someone-else")

        async def bought() -> bool:
            return (await buy(api, token("r2"), product_id)).status_code == 202

        await eventually(bought)
        await eventually(lambda: _ready(api))


async def _ready(api) -> bool:
    ready = await api.get("/api/v1/health/ready")
    return ready.status_code == 200 and ready.json()["redis_state"] == "ok"


async def test_a_stranded_reservation_gets_its_row_without_anyone_running_realignment(
    settings, engine, admin, product_id
):
    """The API died between reserve and publish: the reservation is in Redis, no message was
    sent, the buyer never saw a 202. The recovery task of any API process publishes it again once
    it is older than the grace period."""
    async with _healing_service(settings, engine, "stranded") as (own, api, store, redis):
        body = {"stock": 5, "per_user_limit": 1, "price": 1500, "stock_mode": "redis"}
        assert (await api.put(f"/api/v1/admin/products/{product_id}", json=body, headers=admin)).status_code == 200
        order_no = compose_order_no("FS", "20261130000004", 88, product_id % 1000)
        reservation = await store.reservations.reserve(
            ReserveRequest(product_id, mint_request_id(), "stranded", 1, order_no, new_attempt())
        )
        assert reservation.outcome == "reserved"  # ... and the process died here

        async def landed() -> bool:
            return [row.order_no for row in await order_rows(engine, product_id)] == [order_no]

        await eventually(landed)
        assert await inventory(engine, product_id) == (4, 1)
        assert await redis.hlen(store.product_keys(product_id).journal) in (0, 1)  # dropped by the next pass


async def test_a_keyed_retry_after_redis_lost_its_data_is_answered_the_same_order(
    settings, engine, token, admin, product_id
):
    """The replay records were in Redis only: after a FLUSHALL the recovery pass gives them back
    from MySQL before it loads the stock, so a buyer retrying with their Idempotency-Key gets the
    order they have, not a second one (a second order for one key is a double booking)."""
    async with _healing_service(settings, engine, "replays") as (own, api, store, redis):
        body = {"stock": 5, "per_user_limit": 2, "price": 1500, "stock_mode": "redis"}
        assert (await api.put(f"/api/v1/admin/products/{product_id}", json=body, headers=admin)).status_code == 200
        first = await buy(api, token("keyed"), product_id, key="k-1")
        assert first.status_code == 202
        order_no = first.json()["order_no"]

        async def landed() -> bool:
            return [row.order_no for row in await order_rows(engine, product_id)] == [order_no]

        await eventually(landed)
        await redis.flushall()

        async def answered():
            response = await buy(api, token("keyed"), product_id, key="k-1")
            return response if response.status_code != 503 else None

        retry = await eventually(answered)
        assert (retry.status_code, retry.json()["order_no"]) == (202, order_no)
        await asyncio.sleep(1.5)  # a second order, had one been taken, would have its row by now
        assert await landed()
        assert await inventory(engine, product_id) == (4, 1)
