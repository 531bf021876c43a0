"""Fixtures on a Redis Cluster of the module's own (three masters, :mod:`tests.redis_cluster`),
beside the shared MariaDB and RabbitMQ: the settings of a run of their own (database, key prefix,
queues) with ``redis.cluster`` on, and the API, store and consumer on them. Skipped, with the
reason, where the ``redis-server`` binary is missing."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
from redis.asyncio.cluster import RedisCluster
from sqlalchemy.ext.asyncio import AsyncEngine

from consumers.order_consumer import OrderConsumer
from db.engine import make_engine
from db.migrate import upgrade
from service.adapters.redis.client import make_redis
from service.adapters.redis.stores import RedisStores, open_stores
from service.api.app import create_app
from service.settings import Settings
from tests import redis_cluster
from tests.support import running_consumer, serving
from toolkit.sale.isolation import isolated_settings, new_run_id
from toolkit.sale.stores import tear_down

if not redis_cluster.available():
    pytest.skip(redis_cluster.MISSING, allow_module_level=True)


@pytest.fixture(scope="package")
def cluster_url() -> Iterator[str]:
    with redis_cluster.private_redis_cluster() as url:
        yield url


@pytest.fixture(scope="package")
async def cluster_settings(settings: Settings, cluster_url: str) -> AsyncIterator[Settings]:
    """The suite's settings (secrets, limits) on a run of their own, Redis = the cluster."""
    own = isolated_settings(settings, new_run_id("tc"))
    own = own.model_copy(
        update={
            "redis": own.redis.model_copy(update={"url": cluster_url, "cluster": True}),
            "db": own.db.model_copy(update={"pool_size": 10, "max_overflow": 5}),  # MariaDB's connections are shared
        }
    )
    await upgrade(own.db.url)
    try:
        yield own
    finally:
        await tear_down(own)


@pytest.fixture(scope="package")
async def cluster_engine(cluster_settings: Settings) -> AsyncIterator[AsyncEngine]:
    engine = make_engine(cluster_settings.db.url, pool_size=5, max_overflow=5)
    yield engine
    await engine.dispose()


@pytest.fixture(scope="package")
async def cluster_redis(cluster_settings: Settings) -> AsyncIterator[RedisCluster]:
    client = make_redis(cluster_settings)
    assert isinstance(client, RedisCluster)
    yield client
    await client.aclose()


@pytest.fixture(scope="package")
def cluster_store(cluster_redis: RedisCluster, cluster_settings: Settings) -> RedisStores:
    return open_stores(cluster_redis, cluster_settings.redis.key_prefix)


@pytest.fixture(scope="package")
async def cluster_client(cluster_settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    async with serving(create_app(cluster_settings), timeout=60) as client:
        yield client


@pytest.fixture
async def cluster_consumer(
    cluster_settings: Settings, cluster_engine: AsyncEngine, cluster_store: RedisStores
) -> AsyncIterator[OrderConsumer]:
    async with running_consumer(cluster_settings, cluster_engine, cluster_store) as consumer:
        yield consumer
