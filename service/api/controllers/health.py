"""Liveness and readiness."""

from __future__ import annotations

import msgspec
from litestar import Controller, Response, get
from litestar.di import NamedDependency
from sqlalchemy import text

from service.domain.order_numbers.format import REDIS_SHARDS
from service.domain.order_numbers.minter import leased_shards
from service.startup import BackgroundResources

UNREACHABLE = "unreachable"


class Readiness(msgspec.Struct):
    """``connecting``: the worker has not opened its connections yet (a store was away when it
    started; it keeps trying in the background); ``redis``, ``rabbitmq`` and ``mysql`` then say
    which stores answered its last attempt. ``redis_maxmemory_policy``: Redis's eviction policy
    as last read (None: CONFIG is not available); ``redis_may_evict``: it is not ``noeviction``,
    so Redis may drop stock counters, journal entries, quotas or replay records under memory
    pressure (not ready meanwhile)."""

    ready: bool
    redis: bool
    rabbitmq: bool
    mysql: bool
    shard: int | None
    redis_state: str = "ok"
    """``ok``; ``unreachable`` when Redis did not answer; ``shard lease lost`` when it answers
    but this worker's order-number shard lease lapsed (``redis`` is false in both); ``being
    repaired`` while a product whose Redis state was lost waits for the self-healing pass
    (:mod:`service.domain.stock.recovery`). Not ready unless ``ok``."""
    redis_may_evict: bool = False
    redis_maxmemory_policy: str | None = None
    shards_leased: int | None = None
    """Order-number shards leased by the API workers of this key prefix (this one's included);
    None when Redis did not answer. Informational: a worker that holds its shard is ready."""
    shards_free: int | None = None
    """Shards still free: how many more API worker processes can start (the fleet limit is
    ``shards_total``, :data:`~service.domain.order_numbers.minter.REDIS_SHARDS`)."""
    shards_total: int = REDIS_SHARDS
    connecting: bool = False


class HealthController(Controller):
    path = "/health"
    tags = ["health"]

    @get("/live", summary="The process is up")
    async def live(self) -> dict[str, str]:
        return {"status": "ok"}

    @get("/ready", summary="Redis runs the script and will not evict keys, RabbitMQ has a channel, MySQL answers")
    async def ready(self, worker_resources: NamedDependency[BackgroundResources]) -> Response[Readiness]:
        """200 when Redis has every Lua script, this process holds a shard and Redis's
        ``maxmemory-policy`` is ``noeviction`` (or cannot be read: CONFIG disabled; read at most
        every 30 s), RabbitMQ has a channel and MySQL answers, and no product waits for its lost
        Redis state to be repaired (``redis_state``); 503 (same body) otherwise, also while the
        worker is still connecting (``connecting``). The probe repairs what it can: scripts Redis
        lost are loaded again, publisher channels the broker closed re-opened. It also reports the
        order-number shards leased and free (the fleet limit: one shard per API worker process,
        90 per key prefix)."""
        resources = worker_resources.current
        if resources is None:
            seen = worker_resources.reachable
            state = "ok" if seen["redis"] else UNREACHABLE
            waiting = Readiness(False, seen["redis"], seen["rabbitmq"], seen["mysql"], None, state, connecting=True)
            return Response(waiting, status_code=503)
        rabbit_ok = mysql_ok = False
        lease = resources.lease
        try:
            redis_state = "ok" if await resources.store.scripts.ready() and lease.held else "shard lease lost"
        except Exception:
            redis_state = UNREACHABLE
        eviction = resources.eviction
        try:
            await eviction.check()
        except Exception:
            pass  # Redis unreachable: redis_ok says so; the last policy read stands
        evicts = eviction.may_evict
        rabbit_ok = await resources.publisher.check()
        try:
            async with resources.engine.connect() as conn:
                mysql_ok = (await conn.execute(text("SELECT 1"))).scalar() == 1
        except Exception:
            pass
        leased = None
        try:
            leased = await leased_shards(resources.store)
        except Exception:
            pass  # Redis unreachable: redis_ok says so
        redis_ok = redis_state == "ok"
        if redis_ok and resources.recovery is not None and resources.recovery.repairing:
            redis_state = "being repaired"
        ready = redis_state == "ok" and rabbit_ok and mysql_ok and not evicts
        body = Readiness(
            ready,
            redis_ok,
            rabbit_ok,
            mysql_ok,
            lease.shard,
            redis_state,
            evicts,
            eviction.policy,
            leased,
            None if leased is None else REDIS_SHARDS - leased,
        )
        return Response(body, status_code=200 if ready else 503)
