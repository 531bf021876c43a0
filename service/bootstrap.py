"""Per-process resources, opened once at start-up and shared by every request (no per-request set-up)."""

from __future__ import annotations

from dataclasses import dataclass

from redis.asyncio import BlockingConnectionPool, Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from db.engine import make_engine
from service.adapters.broker import Publisher
from service.adapters.redis.scripts import Scripts
from service.domain.order_no import OrderNumberMinter, ShardLease
from service.domain.purchase import PurchaseService
from service.domain.realign import Realigner
from service.settings import Settings


def make_redis(settings: Settings) -> Redis:
    """One pooled Redis client per process (strings decoded as UTF-8).

    The pool blocks (up to 5 s) when all ``max_connections`` are busy instead of failing the
    request, so a stampede queues for a connection rather than turning into 503s.
    """
    pool = BlockingConnectionPool.from_url(
        settings.redis.url, max_connections=settings.redis.max_connections, timeout=5, decode_responses=True
    )
    return Redis.from_pool(pool)


@dataclass
class Resources:
    """Everything a running API process holds."""

    settings: Settings
    engine: AsyncEngine
    redis: Redis
    scripts: Scripts
    lease: ShardLease
    publisher: Publisher
    purchases: PurchaseService
    realigner: Realigner

    @classmethod
    async def open(cls, settings: Settings) -> Resources:
        """Connect to MySQL, Redis and RabbitMQ, load the scripts and lease an order-number shard."""
        engine = make_engine(settings.db.url, pool_size=settings.db.pool_size, max_overflow=settings.db.max_overflow)
        redis = make_redis(settings)
        scripts = Scripts.register(redis)
        await scripts.load()
        lease = ShardLease(redis, scripts, settings.redis.key_prefix, settings.orders.shard_lease_seconds)
        await lease.start()
        publisher = Publisher(settings.amqp)
        await publisher.connect()
        minter = OrderNumberMinter(redis, lease, settings.redis.key_prefix, settings.orders.order_no_prefix)
        return cls(
            settings=settings,
            engine=engine,
            redis=redis,
            scripts=scripts,
            lease=lease,
            publisher=publisher,
            purchases=PurchaseService(redis, scripts, minter, publisher, settings),
            realigner=Realigner(
                engine, redis, scripts, settings.redis.key_prefix, settings.realign.grace_seconds, publisher
            ),
        )

    async def close(self) -> None:
        """Release the shard lease and close every connection."""
        await self.lease.stop()
        await self.publisher.close()
        await self.redis.aclose()
        await self.engine.dispose()
