"""The rollback plan of stock mode ``redis`` (docs/OPERATIONS.md): Redis is lost, the hot
product is switched to stock mode ``database`` and keeps selling, exactly.

The API runs on a Redis server of the test's own (``private_redis``), shut down mid-test: from
then on every Redis call of the API is refused. The purchase path must not need it: order
numbers come from MySQL (shards 90-99), replays from MySQL's unique request id, the stock mode
from MySQL; the switch itself runs on MySQL alone (admin PUT, or ``flashsale product set``)."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections import Counter

from redis.asyncio import Redis
from redis.exceptions import RedisError

from db.models import OrderStatus
from service.adapters.redis.client import make_redis
from service.adapters.redis.stores import open_stores
from service.domain.order_numbers.format import is_valid_order_no
from service.domain.order_numbers.mysql_minter import MYSQL_SHARDS
from tests.support import (
    api_in_loop,
    buy,
    eventually,
    inventory,
    order_rows,
    private_redis,
    rows_at_least,
    running_consumer,
    start_flashsale,
)
from toolkit.sale.isolation import environment

LIMIT = 1
DATABASE_UNITS = 50
USERS = 150  # each sends two purchases under two keys: 300 concurrent buyers for 50 units


def _on(settings, url: str):
    return settings.model_copy(update={"redis": settings.redis.model_copy(update={"url": url})})


async def _shut_down(url: str) -> None:
    """SHUTDOWN NOSAVE: the server is gone, its port refuses every connection."""
    client = Redis.from_url(url)
    with contextlib.suppress(RedisError, OSError):
        await client.shutdown(nosave=True)
    with contextlib.suppress(RedisError, OSError):
        await client.aclose()

    async def gone() -> bool:
        probe = Redis.from_url(url)
        try:
            await probe.ping()
            return False
        except (RedisError, OSError):
            return True
        finally:
            with contextlib.suppress(RedisError, OSError):
                await probe.aclose()

    await eventually(gone, timeout=10)


@contextlib.asynccontextmanager
async def _sold_in_redis_first(settings, engine, token, admin, product_id: int, stock: int, users: list[str]):
    """An API and a consumer on a Redis of the test's own; the product put on sale in ``redis``
    mode with ``stock`` units and bought once by each of ``users``, their rows written. Yields
    (Redis URL, settings, API client, the product body, the order numbers bought)."""
    async with private_redis() as url:
        own = _on(settings, url)
        store = open_stores(make_redis(own), own.redis.key_prefix)
        try:
            async with api_in_loop(own) as api, running_consumer(own, engine, store):
                body = {"stock": stock, "per_user_limit": LIMIT, "price": 1500, "stock_mode": "redis"}
                put = await api.put(f"/api/v1/admin/products/{product_id}", json=body, headers=admin)
                assert put.status_code == 200, put.text
                landed = await _redis_sales(api, token, product_id, users)
                await eventually(lambda: rows_at_least(engine, product_id, len(landed)))
                yield url, own, api, body, landed
        finally:
            await store.aclose()


async def _redis_sales(api, token, product_id: int, users: list[str]) -> list[str]:
    responses = await asyncio.gather(*(buy(api, token(u), product_id, key=f"{u}-r") for u in users))
    assert {r.status_code for r in responses} == {202}, [r.text for r in responses]
    return [r.json()["order_no"] for r in responses]


async def _stampede(api, token, product_id: int, first_users: list[str]) -> tuple[list, list]:
    """``USERS`` users (``first_users`` among them, who bought in ``redis`` mode), two purchases
    each under two Idempotency-Keys, all at once; then every request again (replays)."""
    asks = [(f"dn-{i}", f"dn-{i}-{k}") for i in range(USERS) for k in "ab"]
    asks += [(u, f"{u}-again") for u in first_users]
    answers = await asyncio.gather(*(buy(api, token(u), product_id, key=key) for u, key in asks))
    replays = await asyncio.gather(*(buy(api, token(u), product_id, key=key) for u, key in asks))
    return answers, replays


async def _check_sold_exactly(engine, product_id: int, stock: int, answers, replays, landed: list[str]) -> None:
    statuses = Counter(r.status_code for r in answers)
    accepted = [r for r in answers if r.status_code == 201]
    assert len(accepted) == DATABASE_UNITS, statuses
    assert {r.json()["code"] for r in answers if r.status_code == 409} <= {"sold_out", "limit_exceeded"}, statuses
    assert set(statuses) <= {201, 409}, [r.text for r in answers if r.status_code not in (201, 409)]
    # Every replay of an accepted purchase answers the same order; no rejected one became an order.
    for first, again in zip(answers, replays, strict=True):
        if first.status_code == 201:
            assert (again.status_code, again.json()["order_no"]) == (201, first.json()["order_no"]), again.text
        else:
            assert again.status_code == 409, again.text
    order_nos = [r.json()["order_no"] for r in accepted]
    assert len(set(order_nos)) == DATABASE_UNITS and all(map(is_valid_order_no, order_nos))
    assert {int(n[16:18]) for n in order_nos} <= set(MYSQL_SHARDS)  # minted in MySQL, not Redis
    rows = await order_rows(engine, product_id)
    assert sorted(r.order_no for r in rows) == sorted(order_nos + landed)
    assert {r.status for r in rows} == {OrderStatus.PENDING_PAYMENT}
    assert max(Counter(r.user_id for r in rows).values()) == LIMIT
    assert await inventory(engine, product_id) == (0, stock)


async def test_switched_to_database_then_redis_lost_sells_exactly_without_redis(
    settings, token, admin, product_id, engine
):
    """Switched while Redis answers (the normal switch), then Redis is lost: 300 buyers for 50
    units, exactly 50 ``201`` (order numbers from MySQL), replays answer the same orders, the
    buyers of the ``redis`` phase stay within the limit."""
    first_users = [f"dn-{i}" for i in range(10)]
    stock = DATABASE_UNITS + len(first_users)
    async with _sold_in_redis_first(settings, engine, token, admin, product_id, stock, first_users) as sale:
        url, _, api, body, landed = sale
        switched = await api.put(
            f"/api/v1/admin/products/{product_id}", json={**body, "stock_mode": "database"}, headers=admin
        )
        assert switched.status_code == 200, switched.text
        await _shut_down(url)
        answers, replays = await _stampede(api, token, product_id, first_users)
        info = (await api.get(f"/api/v1/products/{product_id}")).json()
    assert (info["stock_mode"], info["remaining"]) == ("database", 0)
    await _check_sold_exactly(engine, product_id, stock, answers, replays, landed)


async def test_switch_made_while_redis_is_down_by_the_cli_sells_exactly(settings, token, admin, product_id, engine):
    """Redis is lost while the product sells in ``redis`` mode (every purchase ``503``); the
    operator runs ``flashsale product set ID --stock-mode database``, which needs MySQL only;
    the API, which still has the product routed to Redis, follows at the next purchase."""
    first_users = [f"dn-{i}" for i in range(5)]
    stock = DATABASE_UNITS + len(first_users)
    async with _sold_in_redis_first(settings, engine, token, admin, product_id, stock, first_users) as sale:
        url, own, api, _, landed = sale
        await _shut_down(url)
        lost = await buy(api, token("dn-early"), product_id, key="early")
        assert (lost.status_code, lost.json()["code"]) == (503, "unavailable")  # redis mode needs Redis

        cli = start_flashsale(
            ["product", "set", str(product_id), "--stock", str(stock), "--stock-mode", "database", "--json"],
            {**os.environ, **environment(own)},
            log=os.devnull,
        )
        assert await asyncio.to_thread(cli.wait, 60) == 0

        answers, replays = await _stampede(api, token, product_id, first_users)
    await _check_sold_exactly(engine, product_id, stock, answers, replays, landed)


async def test_reservations_in_flight_when_redis_is_lost_land_without_overselling(
    settings, token, admin, product_id, engine
):
    """Orders accepted in ``redis`` mode whose messages wait in the queue (no consumer) when
    Redis is lost and the product is switched: MySQL sells its stock, then the consumer lands
    the queued orders by the conditional UPDATE (it needs no Redis): they are rejected
    ``sold_out`` when MySQL sold their units meanwhile; never an oversell."""
    queued_users = [f"dq-{i}" for i in range(5)]
    stock = DATABASE_UNITS
    async with private_redis() as url:
        own = _on(settings, url)
        store = open_stores(make_redis(own), own.redis.key_prefix)
        async with api_in_loop(own) as api:
            body = {"stock": stock, "per_user_limit": LIMIT, "price": 1500, "stock_mode": "redis"}
            assert (await api.put(f"/api/v1/admin/products/{product_id}", json=body, headers=admin)).status_code == 200
            queued = await _redis_sales(api, token, product_id, queued_users)
            await _shut_down(url)
            switched = await api.put(
                f"/api/v1/admin/products/{product_id}", json={**body, "stock_mode": "database"}, headers=admin
            )
            assert switched.status_code == 200, switched.text
            assert switched.json()["redis_unreachable"] is True
            answers, _ = await _stampede(api, token, product_id, [])
        async with running_consumer(own, engine, store):
            await eventually(lambda: rows_at_least(engine, product_id, DATABASE_UNITS + len(queued)))
        await store.aclose()
    assert Counter(r.status_code for r in answers)[201] == DATABASE_UNITS
    rows = {r.order_no: r for r in await order_rows(engine, product_id)}
    assert {rows[n].status for n in queued} == {OrderStatus.REJECTED}
    assert {rows[n].reason for n in queued} == {"sold_out"}
    assert await inventory(engine, product_id) == (0, stock)
