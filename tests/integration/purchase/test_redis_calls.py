"""What the purchase path sends to Redis, counted by the Redis server itself (``MONITOR``), under
real concurrency: a rejection answered by Redis costs one command (the reserve script), a
rejection answered by the process's sold-out flag none, an accepted purchase the reserve and the
replay record's ``queued`` mark. Commands that scripts run inside Redis are not counted (one
script call is one command on the wire)."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator

import httpx
import pytest
from redis.asyncio import Redis

from service.api.app import create_app
from service.settings import Settings
from tests.support import buy, serving

BUYERS = 200
_END = "redis-calls-test-end"


@pytest.fixture
async def client(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    """The app with sold-out flags that outlive the test (60 s, not 1 s): on a loaded machine the
    phases below can take longer than a second, and a lapsed flag would send a request to Redis."""
    orders = settings.orders.model_copy(update={"sold_out_flag_seconds": 60.0})
    async with serving(create_app(settings.model_copy(update={"orders": orders})), timeout=30) as client:
        yield client


@contextlib.asynccontextmanager
async def commands_on(settings: Settings, tag: str) -> AsyncIterator[list[str]]:
    """The commands clients send whose arguments name ``tag`` (a product's key tag), as the server
    executes them, from entry until exit (a marker command closes the window, so nothing still
    on its way is missed)."""
    seen: list[str] = []
    watcher = Redis.from_url(settings.redis.url, decode_responses=True)
    started = asyncio.Event()

    async def watch() -> None:
        async with watcher.monitor() as monitor:
            started.set()
            async for info in monitor.listen():
                command = info["command"]
                if command == f"ECHO {_END}:{tag}":
                    return
                if info["client_type"] != "lua" and tag in command:
                    seen.append(command.split(" ", 1)[0].upper())

    task = asyncio.create_task(watch())
    await asyncio.wait_for(started.wait(), 10)
    await asyncio.sleep(0.1)  # MONITOR is registered once the server read it
    try:
        yield seen
    finally:
        await watcher.echo(f"{_END}:{tag}")
        await asyncio.wait_for(task, 10)
        await watcher.aclose()


async def test_each_purchase_outcome_sends_redis_exactly_its_commands(
    client, token, put_product, product_id, settings
) -> None:
    await put_product(product_id, stock=BUYERS, limit=1)
    tag = f"{settings.redis.key_prefix}:{{p:{product_id}}}:"

    async with commands_on(settings, tag) as accepting:
        accepted = await asyncio.gather(*(buy(client, token(f"a{i}"), product_id) for i in range(BUYERS)))
    assert Counter(r.status_code for r in accepted) == {202: BUYERS}
    # per accepted order: the reserve script and the replay record marked queued (the order's
    # own Redis view is keyed by its order number, not the product)
    assert Counter(accepting) == {"EVALSHA": BUYERS, "HSET": BUYERS}

    async with commands_on(settings, tag) as keyed:
        rejected = await asyncio.gather(*(buy(client, token(f"r{i}"), product_id, key=f"k-{i}") for i in range(BUYERS)))
    assert Counter(r.status_code for r in rejected) == {409: BUYERS}
    assert {r.json()["code"] for r in rejected} == {"sold_out"}
    # an Idempotency-Key bypasses the sold-out flag: one round trip, the reserve script alone
    assert Counter(keyed) == {"EVALSHA": BUYERS}

    async with commands_on(settings, tag) as flagged:
        stampede = await asyncio.gather(*(buy(client, token(f"s{i}"), product_id) for i in range(BUYERS)))
    assert Counter(r.status_code for r in stampede) == {409: BUYERS}
    assert {r.json()["code"] for r in stampede} == {"sold_out"}
    assert flagged == []  # the flag set by the answers above: no request reached Redis
