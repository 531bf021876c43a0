"""Liveness and readiness."""

from __future__ import annotations

import msgspec
from litestar import Controller, Response, get
from litestar.di import NamedDependency
from sqlalchemy import text

from service.bootstrap import Resources


class Readiness(msgspec.Struct):
    ready: bool
    redis: bool
    rabbitmq: bool
    mysql: bool
    shard: int | None
    redis_state: str = "ok"
    """``ok``, or ``being repaired`` while a product whose Redis state was lost waits for the
    self-healing pass (:mod:`service.domain.recovery`): not ready meanwhile."""


class HealthController(Controller):
    path = "/health"
    tags = ["health"]

    @get("/live", summary="The process is up")
    async def live(self) -> dict[str, str]:
        return {"status": "ok"}

    @get("/ready", summary="Redis runs the script, RabbitMQ has a channel, MySQL answers")
    async def ready(self, resources: NamedDependency[Resources]) -> Response[Readiness]:
        """200 when Redis has every Lua script and this process holds a shard, RabbitMQ has a
        channel and MySQL answers, and no product waits for its lost Redis state to be repaired
        (``redis_state``); 503 (same body) otherwise. The probe repairs what it can:
        scripts Redis lost are loaded again, publisher channels the broker closed re-opened."""
        redis_ok = rabbit_ok = mysql_ok = False
        lease = resources.lease
        try:
            redis_ok = await resources.store.ready() and lease is not None and lease.held
        except Exception:
            pass
        rabbit_ok = resources.publisher is not None and await resources.publisher.check()
        try:
            async with resources.engine.connect() as conn:
                mysql_ok = (await conn.execute(text("SELECT 1"))).scalar() == 1
        except Exception:
            pass
        repairing = resources.recovery is not None and bool(resources.recovery.repairing)
        ready = redis_ok and rabbit_ok and mysql_ok and not repairing
        body = Readiness(
            ready,
            redis_ok,
            rabbit_ok,
            mysql_ok,
            lease.shard if lease is not None else None,
            "being repaired" if repairing else "ok",
        )
        return Response(body, status_code=200 if ready else 503)
