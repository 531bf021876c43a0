"""Per-process resources, opened once at start-up and shared by every request (no per-request set-up)."""

from __future__ import annotations

from dataclasses import dataclass

from redis.asyncio import BlockingConnectionPool, Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from db.engine import make_engine
from service.adapters.broker import Publisher
from service.adapters.redis.stock_store import StockStore
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


def make_store(settings: Settings) -> StockStore:
    """A :class:`StockStore` on a new :func:`make_redis` client, with the run's key prefix and
    replay TTL (scripts registered, not yet loaded: call ``load()`` where the hot path follows)."""
    return StockStore(
        make_redis(settings), settings.redis.key_prefix, replay_ttl_seconds=settings.orders.replay_ttl_seconds
    )


@dataclass
class Resources:
    """Everything a running API process holds."""

    settings: Settings
    engine: AsyncEngine
    store: StockStore
    lease: ShardLease
    publisher: Publisher
    purchases: PurchaseService
    realigner: Realigner

    @classmethod
    async def open(cls, settings: Settings) -> Resources:
        """Connect to MySQL, Redis and RabbitMQ, load the scripts and lease an order-number shard."""
        engine = make_engine(settings.db.url, pool_size=settings.db.pool_size, max_overflow=settings.db.max_overflow)
        store = make_store(settings)
        await store.load()
        lease = ShardLease(store, settings.orders.shard_lease_seconds)
        await lease.start()
        publisher = Publisher(settings.amqp)
        await publisher.connect()
        minter = OrderNumberMinter(store, lease, settings.orders.order_no_prefix)
        return cls(
            settings=settings,
            engine=engine,
            store=store,
            lease=lease,
            publisher=publisher,
            purchases=PurchaseService(store, minter, publisher),
            realigner=Realigner(engine, store, settings.realign.grace_seconds, publisher),
        )

    async def close(self) -> None:
        """Release the shard lease and close every connection."""
        await self.lease.stop()
        await self.publisher.close()
        await self.store.aclose()
        await self.engine.dispose()
