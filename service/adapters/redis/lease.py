"""Leases: exclusive use of a named thing for a while, held by a token unique to the holder.

One :class:`Lease` type for both kinds the service takes: an order-number shard's (one process
mints in a shard at a time) and a named lock of the deployment (e.g. ``recovery``: one
self-healing pass at a time). Taken with SET NX PX, renewed and released by scripts that check
the holder (``lua/lease_renew.lua``, ``lua/lease_release.lua``).
Failures raise the vocabulary only (:mod:`.boundary`).
"""

from __future__ import annotations

from service.adapters.redis.boundary import translated
from service.adapters.redis.client import RedisClient
from service.adapters.redis.keys import lock_key, shard_lease_key
from service.adapters.redis.scripts import KeyspaceStore, Scripts


class Lease:
    """The lease on one key (:meth:`Leases.shard`, :meth:`Leases.lock`)."""

    def __init__(self, redis: RedisClient, scripts: Scripts, key: str) -> None:
        self._redis = redis
        self._scripts = scripts
        self.key = key

    @translated
    async def acquire(self, holder: str, ttl_ms: int) -> bool:
        """SET NX PX: True when ``holder`` (a token unique to the caller) now holds the lease for
        ``ttl_ms`` milliseconds, False when someone else holds it."""
        return bool(await self._redis.set(self.key, holder, nx=True, px=ttl_ms))

    async def renew(self, holder: str, ttl_ms: int) -> bool:
        """``lua/lease_renew.lua``: extend ``holder``'s lease to ``ttl_ms`` milliseconds from now;
        False when it expired or belongs to someone else."""
        return bool(await self._scripts.run("lease_renew", keys=[self.key], args=[holder, ttl_ms]))

    async def release(self, holder: str) -> bool:
        """``lua/lease_release.lua``: drop ``holder``'s lease; False when not held."""
        return bool(await self._scripts.run("lease_release", keys=[self.key], args=[holder]))


class Leases(KeyspaceStore):
    """The leases of one key prefix."""

    def shard(self, shard: int) -> Lease:
        """The lease on order-number shard ``shard`` (00-99)."""
        return Lease(self._redis, self._scripts, shard_lease_key(self._prefix, shard))

    def lock(self, name: str) -> Lease:
        """The lock ``name`` of this key prefix's deployment."""
        return Lease(self._redis, self._scripts, lock_key(self._prefix, name))

    @translated
    async def leased_shards(self, shards: int) -> int:
        """How many of shards ``0 .. shards - 1`` are leased now: EXISTS of each lease key in one
        pipeline (on a cluster, one round trip per node)."""
        async with self._redis.pipeline(transaction=False) as pipe:
            for shard in range(shards):
                pipe.exists(shard_lease_key(self._prefix, shard))
            return sum(int(found) for found in await pipe.execute())
