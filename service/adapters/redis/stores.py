"""The Redis stores of one process, built in one place (:func:`make_stores`) on one client and
one script registry; each piece owns its own key names (:mod:`.keys`) and answers in the
domain's types (:mod:`service.model.stock`).

Every method raises :class:`~service.failures.StoreUnavailable` ``("redis")`` when Redis
fails, never a redis-py exception (:mod:`.boundary`).
"""

from __future__ import annotations

from service.adapters.redis.batcher import CommandBatcher
from service.adapters.redis.boundary import translated
from service.adapters.redis.buckets import StockBuckets
from service.adapters.redis.client import RedisClient, make_redis
from service.adapters.redis.eviction import EvictionPolicy
from service.adapters.redis.keys import ProductKeys
from service.adapters.redis.lease import Leases
from service.adapters.redis.order_tokens import OrderTokens
from service.adapters.redis.replays import Replays
from service.adapters.redis.reservations import RETURNED_MARKER_TTL_SECONDS, RateLimits, Reservations
from service.adapters.redis.restock_channel import RestockChannel
from service.adapters.redis.scripts import Scripts
from service.adapters.redis.sequences import OrderNumberSequences
from service.adapters.redis.stock import Stock
from service.adapters.redis.waiting_room import WaitingRooms
from service.settings import Settings


class RedisStores:
    """The pieces, on one client (:func:`open_stores`): reservations, stock, replays, order
    tokens, leases, order-number sequences, stock buckets, the restock channel and the waiting
    rooms, plus the
    script registry (load once at start-up where the hot path follows: ``scripts.load()``).

    A plain class, not a dataclass: frameworks that inspect dataclass fields (Litestar's
    signature models, through ``Resources``) would try to decode the client's type."""

    def __init__(
        self,
        redis: RedisClient,
        key_prefix: str,
        scripts: Scripts,
        batcher: CommandBatcher,
        *,
        reservations: Reservations,
        stock: Stock,
        replays: Replays,
        tokens: OrderTokens,
        leases: Leases,
        sequences: OrderNumberSequences,
        buckets: StockBuckets,
        restocks: RestockChannel,
        rooms: WaitingRooms,
    ) -> None:
        self.redis = redis
        self.key_prefix = key_prefix
        self.scripts = scripts
        self.reservations = reservations
        self.stock = stock
        self.replays = replays
        self.tokens = tokens
        self.leases = leases
        self.sequences = sequences
        self.buckets = buckets
        self.restocks = restocks
        self.rooms = rooms
        self._batcher = batcher

    def product_keys(self, product_id: int, bucket: int = 0) -> ProductKeys:
        """The key names of one product's ``bucket`` (for tests that inspect Redis state)."""
        return ProductKeys(self.key_prefix, product_id, bucket)

    @translated
    async def ping(self) -> bool:
        """True when Redis answers PING."""
        return bool(await self.redis.ping())

    def eviction_policy(self) -> EvictionPolicy:
        """A reader of this Redis's ``maxmemory-policy`` (readiness: :mod:`.eviction`)."""
        return EvictionPolicy(self.redis)

    async def aclose(self) -> None:
        """Close the client (and its connection pool) and the hot path's own connection
        (:class:`CommandBatcher`)."""
        await self._batcher.aclose()
        await self.redis.aclose()


def open_stores(
    redis: RedisClient,
    key_prefix: str,
    *,
    replay_ttl_seconds: int = 86_400,
    returned_marker_ttl_seconds: int = RETURNED_MARKER_TTL_SECONDS,
    rate_limits: RateLimits | None = None,
) -> RedisStores:
    """Every store on ``redis`` (which must decode responses) under ``key_prefix``; the scripts
    are registered, not yet loaded. ``replay_ttl_seconds``: how long a replay record and a
    queued order's view live."""
    scripts = Scripts(redis)
    batcher = CommandBatcher(redis)
    restocks = RestockChannel(redis, key_prefix)
    return RedisStores(
        redis,
        key_prefix,
        scripts,
        batcher,
        reservations=Reservations(
            redis,
            scripts,
            batcher,
            restocks,
            key_prefix,
            replay_ttl_seconds=replay_ttl_seconds,
            returned_marker_ttl_seconds=returned_marker_ttl_seconds,
            rate_limits=rate_limits,
        ),
        stock=Stock(redis, scripts, restocks, key_prefix),
        replays=Replays(redis, scripts, key_prefix, replay_ttl_seconds),
        tokens=OrderTokens(redis, scripts, key_prefix),
        leases=Leases(redis, scripts, key_prefix),
        sequences=OrderNumberSequences(scripts, key_prefix),
        buckets=StockBuckets(redis, scripts, restocks, key_prefix),
        restocks=restocks,
        rooms=WaitingRooms(redis, scripts, batcher, key_prefix),
    )


def make_stores(settings: Settings) -> RedisStores:
    """:func:`open_stores` on a new :func:`~.client.make_redis` client, with the run's key
    prefix, replay TTL and purchase rate limits."""
    limits = settings.rate_limit
    return open_stores(
        make_redis(settings),
        settings.redis.key_prefix,
        replay_ttl_seconds=settings.orders.replay_ttl_seconds,
        rate_limits=RateLimits(
            limits.user_per_second, limits.user_burst, limits.address_per_second, limits.address_burst
        ),
    )
