"""Liveness and readiness."""

from __future__ import annotations

import msgspec
from litestar import Controller, Response, get
from litestar.di import NamedDependency
from sqlalchemy import text

from service.bootstrap import BackgroundResources


class Readiness(msgspec.Struct):
    """``connecting``: the worker has not opened its connections yet (a store was away when it
    started; it keeps trying in the background); ``redis``, ``rabbitmq`` and ``mysql`` then say
    which stores answered its last attempt."""

    ready: bool
    redis: bool
    rabbitmq: bool
    mysql: bool
    shard: int | None
    connecting: bool = False


class HealthController(Controller):
    path = "/health"
    tags = ["health"]

    @get("/live", summary="The process is up")
    async def live(self) -> dict[str, str]:
        return {"status": "ok"}

    @get("/ready", summary="Redis runs the script, RabbitMQ has a channel, MySQL answers")
    async def ready(self, worker_resources: NamedDependency[BackgroundResources]) -> Response[Readiness]:
        """200 when Redis has every Lua script and this process holds a shard, RabbitMQ has a
        channel and MySQL answers; 503 (same body) otherwise, also while the worker is still
        connecting (``connecting``). The probe repairs what it can: scripts Redis lost are
        loaded again, publisher channels the broker closed re-opened."""
        resources = worker_resources.current
        if resources is None:
            seen = worker_resources.reachable
            waiting = Readiness(False, seen["redis"], seen["rabbitmq"], seen["mysql"], None, connecting=True)
            return Response(waiting, status_code=503)
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
        ready = redis_ok and rabbit_ok and mysql_ok
        body = Readiness(ready, redis_ok, rabbit_ok, mysql_ok, lease.shard if lease is not None else None)
        return Response(body, status_code=200 if ready else 503)
