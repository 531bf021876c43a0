"""Integration fixtures on the real MariaDB, Redis and RabbitMQ (only for tests under ``tests/integration``).

The servers are the ones ``FLASHSALE_*`` settings name (``FLASHSALE_DB__URL``, ``FLASHSALE_REDIS__URL``,
``FLASHSALE_AMQP__URL``, ...; defaults: localhost). Each test session gets its own database, Redis key
prefix and queue names (``t_<hex>``) and removes them at the end; each test uses its own product ids.
Unit tests (``tests/unit``) never load this file, so they run with every server unreachable.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator

import aio_pika
import httpx
import pytest
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from consumers.order_consumer import OrderConsumer
from db.engine import make_engine
from db.migrate import upgrade
from service.adapters.broker_topology import declare_topology
from service.adapters.redis.client import make_redis
from service.adapters.redis.stores import RedisStores, open_stores
from service.api.app import create_app
from service.api.tokens import issue_token
from service.settings import Settings
from tests.support import running_consumer, serving
from toolkit.sale.isolation import isolated_settings, new_run_id, with_own_secrets
from toolkit.sale.stores import tear_down

_product_ids = itertools.count(1000)


@pytest.fixture(scope="session")
def settings() -> Settings:
    base = Settings()
    isolated = with_own_secrets(isolated_settings(base, new_run_id("t")))
    return isolated.model_copy(
        update={
            "amqp": isolated.amqp.model_copy(update={"delivery_limit": 2, "confirm_timeout": 3.0}),
            "db": isolated.db.model_copy(update={"pool_size": 40}),
            # No channel URL: the in-process API never calls a channel by accident (tests of the
            # channel simulator give their own, tests/integration/payments/conftest.py).
            "payment": isolated.payment.model_copy(update={"channel_urls": {}}),
            # The suite's crowds come from one address and reuse users: rates are tested on their own.
            "rate_limit": isolated.rate_limit.model_copy(update={"user_per_second": 0.0, "address_per_second": 0.0}),
            # No self-healing pass behind the tests' backs (tests/integration/recovery turn it on):
            # many tests set Redis state up by hand and check what one explicit pass does to it.
            "realign": isolated.realign.model_copy(update={"auto_seconds": 0.0}),
            # Line order is checked one join at a time: exact arrival order, an admission told at
            # the join (the windows are tested on their own, tests/integration/waiting_room/test_pace.py);
            # waiting buyers are told to come back soon, so tests that wait as told wait little; a
            # crowd's round of polls takes longer than 3 x 0.1 s on this box: nobody departs
            # (departures are tested on their own, tests/integration/waiting_room/test_turns.py); the
            # room opens with the sale (the opening draw is tested on its own, test_lottery.py).
            "waiting_room": isolated.waiting_room.model_copy(
                update={
                    "arrival_window_ms": 0,
                    "poll_min_ms": 100,
                    "poll_max_ms": 200,
                    "depart_after_polls": 1000.0,
                    "opening_draw_ms": 0,
                }
            ),
        }
    )


# autouse applies to tests/integration only (this conftest's package); tests/unit never reaches it.
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
def store(redis: Redis, settings: Settings) -> RedisStores:
    return open_stores(redis, settings.redis.key_prefix, replay_ttl_seconds=settings.orders.replay_ttl_seconds)


@pytest.fixture
def product_id() -> int:
    return next(_product_ids)


@pytest.fixture
def new_product_id():
    return lambda: next(_product_ids)


@pytest.fixture(scope="session")
async def client(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    async with serving(create_app(settings), timeout=30) as client:
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
def put_product(client: httpx.AsyncClient, admin: dict[str, str]):
    """``await put_product(id, stock=, limit=, **fields)`` through the admin route."""

    async def put(product_id: int, stock: int, limit: int = 1, **fields) -> dict:
        body = {"stock": stock, "per_user_limit": limit, "price": 1500, "stock_mode": "redis", **fields}
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
async def consumer(settings: Settings, engine: AsyncEngine, store: RedisStores) -> AsyncIterator[OrderConsumer]:
    """An in-process consumer on the run's queue, running for the duration of the test."""
    async with running_consumer(settings, engine, store) as order_consumer:
        yield order_consumer
