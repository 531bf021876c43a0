"""Redis loses its scripts or its connections, or stalls: the API recovers without a restart.

Everything that would hurt the shared Redis (SCRIPT FLUSH, CLIENT KILL) is done to a private
``redis-server`` of the test's own (tests/support.private_redis); MySQL and RabbitMQ are the
run's.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest
from redis.asyncio import Redis

from service.adapters.redis.reservations import new_attempt
from service.adapters.redis.stores import make_stores
from service.api.app import create_app
from service.domain.order_numbers.format import compose_order_no
from service.model.stock import (
    ClaimOutcome,
    ReleaseOutcome,
    ReserveOutcome,
    ReserveRequest,
    RestockOutcome,
    SaleTerms,
)
from service.settings import Settings
from tests.support import PausableProxy, buy, private_redis, serving

pytestmark = pytest.mark.slow  # starts a redis-server


def _on_redis(settings: Settings, url: str) -> Settings:
    return settings.model_copy(update={"redis": settings.redis.model_copy(update={"url": url})})


@pytest.fixture
async def own_redis(settings: Settings) -> AsyncIterator[tuple[Settings, Redis]]:
    """The run's settings on a private Redis, and a plain client on it (for the harm done)."""
    async with private_redis() as url:
        raw = Redis.from_url(url, decode_responses=True)
        try:
            yield _on_redis(settings, url), raw
        finally:
            await raw.aclose()


@pytest.fixture
async def api(own_redis) -> AsyncIterator[httpx.AsyncClient]:
    on_redis, _ = own_redis
    async with serving(create_app(on_redis), timeout=30) as client:
        yield client


async def _put(client: httpx.AsyncClient, admin: dict[str, str], product_id: int, stock: int) -> None:
    body = {"stock": stock, "per_user_limit": 1, "price": 1500, "stock_mode": "redis"}
    response = await client.put(f"/api/v1/admin/products/{product_id}", json=body, headers=admin)
    assert response.status_code == 200, response.text


async def test_ready_comes_back_after_script_flush_without_a_purchase(api, own_redis):
    _, raw = own_redis
    assert (await api.get("/api/v1/health/ready")).status_code == 200
    await raw.script_flush()
    ready = await api.get("/api/v1/health/ready")
    assert ready.status_code == 200, ready.text
    assert ready.json()["redis"] is True


async def test_every_script_runs_after_a_flush(own_redis, product_id):
    on_redis, raw = own_redis
    store = make_stores(on_redis)
    try:
        await store.scripts.load()
        terms = SaleTerms(starts_ms=0, ends_ms=0, per_user_limit=5, price=100)

        await raw.script_flush()
        _, server = await store.stock.journal_size(product_id)  # the run id a write must name
        await raw.script_flush()
        loaded = await store.stock.realign(
            product_id,
            mysql_stock=10,
            inventory_version=1,
            terms=terms,
            resolved=(),
            units_held=(),
            dry_run=False,
            server=server,
        )
        assert loaded.stock_after == 10

        first, second = "0" * 31 + "1", "0" * 31 + "2"
        await raw.script_flush()
        reserved = await store.reservations.reserve(
            ReserveRequest(product_id, first, "u1", 1, compose_order_no("FS", "20261130000000", 1, 1), new_attempt())
        )
        assert reserved.outcome is ReserveOutcome.RESERVED
        second_attempt = new_attempt()
        await store.reservations.reserve(
            ReserveRequest(product_id, second, "u2", 1, compose_order_no("FS", "20261130000000", 1, 2), second_attempt)
        )

        await raw.script_flush()
        assert await store.reservations.claim(product_id, first) is ClaimOutcome.HELD
        await raw.script_flush()
        assert await store.reservations.release(product_id, second, second_attempt) is ReleaseOutcome.RELEASED
        await raw.script_flush()
        restocked = await store.reservations.restock(
            product_id, compose_order_no("FS", "20261130000000", 1, 1), "u1", 1, 2, release_quota=True
        )
        assert restocked is RestockOutcome.RETURNED

        assert await store.leases.shard(42).acquire("me", 10_000)
        await raw.script_flush()
        assert await store.leases.shard(42).renew("me", 10_000)
        await raw.script_flush()
        assert await store.leases.shard(42).release("me")

        await raw.script_flush()
        assert await store.scripts.ready()
        assert all(await raw.script_exists(*store.scripts.shas))
    finally:
        await store.aclose()


async def test_killed_idle_connections_do_not_answer_503(api, own_redis, admin, token, new_product_id):
    _, raw = own_redis
    product_id = new_product_id()
    await _put(api, admin, product_id, stock=50)
    first = await buy(api, token("k0"), product_id, key="k0-key")
    assert first.status_code == 202, first.text
    for round_ in range(3):
        # every pooled connection of the API (and of the restock follower: pubsub, not "normal") is cut
        killed = await raw.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
        assert int(killed) >= 1
        answers = await asyncio.gather(
            buy(api, token("k0"), product_id, key="k0-key"),  # a duplicate: never a 5xx
            *(buy(api, token(f"k{round_}-{i}"), product_id) for i in range(5)),
        )
        assert [a.status_code for a in answers] == [202] * 6, [a.text for a in answers]
        assert answers[0].json()["order_no"] == first.json()["order_no"]


async def test_a_stall_fails_every_waiting_purchase_fast_not_one_after_another(own_redis, admin, token, new_product_id):
    on_redis, raw = own_redis
    host, port = raw.connection_pool.connection_kwargs["host"], raw.connection_pool.connection_kwargs["port"]
    proxy = PausableProxy((host, port))
    proxy_port = await proxy.start()
    redis = on_redis.redis.model_copy(
        update={"url": f"redis://127.0.0.1:{proxy_port}/0", "socket_timeout": 1.0, "connect_timeout": 1.0}
    )
    try:
        async with serving(create_app(on_redis.model_copy(update={"redis": redis})), timeout=60) as api:
            product_id = new_product_id()
            await _put(api, admin, product_id, stock=100)
            assert (await buy(api, token("w-first"), product_id)).status_code == 202
            await asyncio.sleep(1.1)  # a new second: the next purchases need a new block of order numbers
            proxy.paused = True
            crowd = asyncio.gather(*(buy(api, token(f"w{i}"), product_id) for i in range(40)))
            # Redis stalls for 8 socket timeouts. Callers queued behind the minter's one block
            # refill used to wait it out one after another (each a timeout) and were answered
            # 202 once Redis came back: a stall held the purchases for as long as it lasted.
            done, _ = await asyncio.wait({crowd}, timeout=8)
            proxy.paused = False
            answers = await crowd
            assert done, "purchases still waiting after 8 socket timeouts of stall"
            assert [a.status_code for a in answers] == [503] * 40, [a.text for a in answers if a.status_code != 503]
            again = await asyncio.wait_for(buy(api, token("w-after"), product_id), timeout=30)
            assert again.status_code == 202, again.text
    finally:
        proxy.paused = False
        await proxy.stop()


async def test_a_stalled_redis_answers_503_instead_of_hanging(own_redis, admin, token, new_product_id):
    on_redis, raw = own_redis
    host, port = raw.connection_pool.connection_kwargs["host"], raw.connection_pool.connection_kwargs["port"]
    proxy = PausableProxy((host, port))
    proxy_port = await proxy.start()
    stalled = on_redis.model_copy(
        update={
            "redis": on_redis.redis.model_copy(
                update={"url": f"redis://127.0.0.1:{proxy_port}/0", "socket_timeout": 1.0, "connect_timeout": 1.0}
            )
        }
    )
    try:
        async with serving(create_app(stalled), timeout=60) as api:
            product_id = new_product_id()
            await _put(api, admin, product_id, stock=5)
            assert (await buy(api, token("s1"), product_id)).status_code == 202
            proxy.paused = True
            # The bound is the test's own patience, not a timing claim: without a socket timeout
            # the request would wait for as long as Redis stalls (here: for ever).
            answer = await asyncio.wait_for(buy(api, token("s2"), product_id), timeout=30)
            assert answer.status_code == 503, answer.text
            assert answer.json()["code"] == "unavailable" and "retry-after" in answer.headers
            proxy.paused = False
            again = await asyncio.wait_for(buy(api, token("s3"), product_id), timeout=30)
            assert again.status_code == 202, again.text
    finally:
        proxy.paused = False
        await proxy.stop()
