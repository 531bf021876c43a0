"""Integration fixtures on the real MariaDB, Redis and RabbitMQ.

Each test session gets its own database, Redis key prefix and queue names (``t_<hex>``) and
removes them at the end; each test uses its own product ids.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator

import aio_pika
import pytest
from litestar.testing import AsyncTestClient
from redis.asyncio import Redis
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from consumers.order_consumer import OrderConsumer
from db.engine import make_engine
from db.migrate import upgrade
from service.adapters.broker import declare_topology
from service.adapters.redis.stock_store import StockStore
from service.api.app import create_app
from service.api.auth import issue_token
from service.bootstrap import make_redis
from service.sale.isolation import isolated_settings, new_run_id
from service.sale.stores import tear_down
from service.settings import Settings

_product_ids = itertools.count(1000)


@pytest.fixture(scope="session")
def settings() -> Settings:
    base = Settings()
    isolated = isolated_settings(base, new_run_id("t"))
    return isolated.model_copy(
        update={
            "amqp": isolated.amqp.model_copy(update={"delivery_limit": 2, "confirm_timeout": 3.0}),
            "db": isolated.db.model_copy(update={"pool_size": 40}),
        }
    )


@pytest.fixture(scope="session", autouse=True)
async def isolated_services(settings: Settings) -> AsyncIterator[None]:
    await upgrade(settings.db.url)
    try:
        yield
    finally:
        await tear_down(settings)


@pytest.fixture(scope="session")
async def engine(settings: Settings) -> AsyncIterator[AsyncEngine]:
    engine = make_engine(settings.db.url, pool_size=settings.db.pool_size, max_overflow=settings.db.max_overflow)
    yield engine
    await engine.dispose()


@pytest.fixture(scope="session")
async def redis(settings: Settings) -> AsyncIterator[Redis]:
    client = make_redis(settings)
    yield client
    await client.aclose()


@pytest.fixture(scope="session")
def store(redis: Redis, settings: Settings) -> StockStore:
    return StockStore(redis, settings.redis.key_prefix, replay_ttl_seconds=settings.orders.replay_ttl_seconds)


@pytest.fixture
def product_id() -> int:
    return next(_product_ids)


@pytest.fixture
def new_product_id():
    return lambda: next(_product_ids)


@pytest.fixture(scope="session")
async def client(settings: Settings) -> AsyncIterator[AsyncTestClient]:
    async with AsyncTestClient(app=create_app(settings), timeout=30) as client:
        yield client


@pytest.fixture(scope="session")
def token(settings: Settings):
    """``token(user, admin=False) -> "Bearer ..."`` headers dict."""

    def make(user: str, admin: bool = False) -> dict[str, str]:
        return {"Authorization": f"Bearer {issue_token(settings.auth.jwt_secret, user, admin)}"}

    return make


@pytest.fixture(scope="session")
def admin(token) -> dict[str, str]:
    return token("admin", admin=True)


@pytest.fixture
def put_product(client: AsyncTestClient, admin: dict[str, str]):
    """``await put_product(id, stock=, limit=, **fields)`` through the admin route."""

    async def put(product_id: int, stock: int, limit: int = 1, **fields) -> dict:
        body = {"stock": stock, "per_user_limit": limit, "price": 1500, **fields}
        response = await client.put(f"/api/v1/admin/products/{product_id}", json=body, headers=admin)
        assert response.status_code == 200, response.text
        return response.json()

    return put


@pytest.fixture(scope="session")
async def amqp_channel(settings: Settings) -> AsyncIterator[aio_pika.abc.AbstractChannel]:
    connection = await aio_pika.connect_robust(settings.amqp.url)
    channel = await connection.channel()
    await declare_topology(channel, settings.amqp)
    yield channel
    await connection.close()


@pytest.fixture
async def consumer(settings: Settings, engine: AsyncEngine, store: StockStore) -> AsyncIterator[OrderConsumer]:
    """An in-process consumer on the run's queue, running for the duration of the test."""
    connection = await aio_pika.connect_robust(settings.amqp.url)
    channel = await connection.channel()
    await channel.set_qos(prefetch_count=32)
    _, queue = await declare_topology(channel, settings.amqp)
    order_consumer = OrderConsumer(engine, store)
    tag = await queue.consume(order_consumer.handle)
    try:
        yield order_consumer
    finally:
        await queue.cancel(tag)
        await order_consumer.drain()
        await connection.close()


async def eventually(check, timeout: float = 20.0, interval: float = 0.05):
    """Poll the async ``check`` until it returns a truthy value; fail after ``timeout`` seconds."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        result = await check()
        if result:
            return result
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"condition not met within {timeout}s (last: {result!r})")
        await asyncio.sleep(interval)


async def order_rows(engine: AsyncEngine, product_id: int) -> list:
    async with engine.connect() as conn:
        return list(
            await conn.execute(
                text("SELECT order_no, request_id, user_id, quantity, status, reason FROM orders WHERE product_id = :p"),
                {"p": product_id},
            )
        )


async def inventory(engine: AsyncEngine, product_id: int) -> tuple[int, int]:
    async with engine.connect() as conn:
        row = (await conn.execute(text("SELECT stock, sold FROM inventory WHERE product_id = :p"), {"p": product_id})).one()
        return row.stock, row.sold


async def redis_state(redis: Redis, settings: Settings, product_id: int) -> dict:
    """Everything Redis holds for a product (for "left no trace" assertions)."""
    keys = StockStore(redis, settings.redis.key_prefix).product_keys(product_id)
    found = sorted([key async for key in redis.scan_iter(match=f"{keys.tag}:*", count=1000)])
    return {
        "keys": found,
        "stock": await redis.get(keys.stock),
        "journal": await redis.hgetall(keys.journal),
        "quota": await redis.hgetall(keys.quota),
    }


@contextlib.asynccontextmanager
async def sampling_min_stock(redis: Redis, key: str, interval: float = 0.001):
    """Samples a stock key while the block runs; yields a list whose [0] becomes the minimum seen."""
    seen: list[int] = []
    stop = asyncio.Event()

    async def sample() -> None:
        while not stop.is_set():
            value = await redis.get(key)
            if value is not None:
                seen.append(int(value))
            await asyncio.sleep(interval)

    task = asyncio.create_task(sample())
    result: list[int] = []
    try:
        yield result
    finally:
        stop.set()
        await task
        result.append(min(seen) if seen else 0)


class RunsAfterJournalRead:
    """The real Redis client, except that right after the realigner reads a product's journal,
    ``during_read`` runs (real consumers commit, another pass runs, an operator changes the
    product): the races of realignment, made to happen at their worst moment. Everything goes to
    the real Redis and MySQL."""

    def __init__(self, redis: Redis, during_read) -> None:
        self._redis = redis
        self._during_read = during_read

    def __getattr__(self, name: str):
        return getattr(self._redis, name)

    async def hgetall(self, key: str) -> dict[str, str]:
        journal = await self._redis.hgetall(key)
        await self._during_read()
        return journal
