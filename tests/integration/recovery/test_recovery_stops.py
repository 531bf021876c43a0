"""The recovery task stops when told, whatever it is doing (the API's shutdown waits for it).

Its passes await Redis commands that redis-py wraps in ``asyncio.wait_for``, which on Python 3.11
drops a cancellation arriving as the command completes (CPython gh-86296): one cancel was not
enough, and a stopped task ran its passes on forever (a test hung; an API worker never exited)."""

from __future__ import annotations

import asyncio
import random

from service.adapters.redis.client import make_redis
from service.adapters.redis.stores import open_stores
from service.domain.stock.realign import Realigner
from service.domain.stock.recovery import Recovery
from tests.support import private_redis


class _Counted:
    """The realigner the recovery task uses, counting the passes it starts."""

    def __init__(self, realigner: Realigner) -> None:
        self._realigner = realigner
        self.calls = 0

    async def product_ids(self) -> list[int]:
        return await self._realigner.product_ids()

    async def realign(self, product_id: int) -> object:
        self.calls += 1
        return await self._realigner.realign(product_id)


async def test_recovery_stops_at_any_point_of_its_passes(settings, engine, put_product, new_product_id):
    for _ in range(40):
        await put_product(new_product_id(), stock=10)
    async with private_redis() as url:
        own = settings.model_copy(update={"redis": settings.redis.model_copy(update={"url": url})})
        redis = make_redis(own)
        store = open_stores(redis, own.redis.key_prefix)
        try:
            realigner = _Counted(Realigner(engine, store, own.realign.grace_seconds, None))
            for _ in range(60):
                recovery = Recovery(realigner, store, every_seconds=0.0)  # type: ignore[arg-type]
                recovery.start()
                await asyncio.sleep(random.uniform(0.01, 1.0))  # mid-pass or between passes
                async with asyncio.timeout(10):
                    await recovery.stop()
                stopped_at = realigner.calls
                await asyncio.sleep(0.2)
                assert realigner.calls == stopped_at, "the recovery task ran on after stop()"
        finally:
            await redis.aclose()
