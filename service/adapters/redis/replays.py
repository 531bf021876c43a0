"""Replay records: what answers a retried purchase (same request id) with its first answer.

``lua/reserve.lua`` writes a record (``pending``) with each reservation, and the purchase path
marks it ``queued`` once the broker confirmed (:meth:`.reservations.Reservations.mark_queued`).
Here: the records realignment and the stock modes write for orders MySQL already holds.
Failures raise the vocabulary only (:mod:`.boundary`).
"""

from __future__ import annotations

from collections.abc import Sequence

from service.adapters.redis.boundary import translated
from service.adapters.redis.client import RedisClient
from service.adapters.redis.keys import ProductKeys
from service.adapters.redis.scripts import KeyspaceStore, Scripts

RESTORE_BATCH = 1000
"""Replay records one ``restore_replays.lua`` call writes, at most."""
SEED_BATCH = 500
"""Replay records one pipeline of :meth:`Replays.seed` writes."""


class Replays(KeyspaceStore):
    """Replay records of one key prefix, each living ``ttl_seconds``."""

    def __init__(self, redis: RedisClient, scripts: Scripts, key_prefix: str, ttl_seconds: int) -> None:
        super().__init__(redis, scripts, key_prefix)
        self.ttl_seconds = ttl_seconds
        """How long a replay record (and a queued order's view) lives, in seconds."""

    async def restore(self, product_id: int, orders: Sequence[tuple[str, str, int, int]], *, bucket: int = 0) -> int:
        """``lua/restore_replays.lua``: the replay record of each order (request id, order number,
        quantity in units, age in seconds of its row) that Redis does not have, as ``queued``,
        living what is left of ``ttl_seconds`` (orders older than that are skipped), in calls of
        at most :data:`RESTORE_BATCH` records, in the product's ``bucket`` (the buyers'). Returns
        how many records were written."""
        keys = ProductKeys(self._prefix, product_id, bucket)
        live = [order for order in orders if order[3] < self.ttl_seconds]
        written = 0
        for start in range(0, len(live), RESTORE_BATCH):
            chunk = live[start : start + RESTORE_BATCH]
            args: list[str | int] = []
            for _, order_no, quantity, age in chunk:
                args += [quantity, order_no, self.ttl_seconds - age]
            written += int(
                await self._scripts.run("restore_replays", keys=[keys.replay(order[0]) for order in chunk], args=args)
            )
        return written

    @translated
    async def seed(self, product_id: int, orders: list[tuple[str, str, int]], *, bucket: int = 0) -> None:
        """Replay records (state ``queued``) for orders MySQL already holds: ``(request_id,
        order_no, quantity)``, each living ``ttl_seconds``. For a product moving to stock mode
        ``redis``: a retry of a purchase answered in ``database`` mode must be answered as its
        replay (same order number), not taken as a new purchase (IETF Idempotency-Key draft).
        Pipelined, :data:`SEED_BATCH` orders per round trip, into the product's ``bucket`` (the
        buyers')."""
        keys = ProductKeys(self._prefix, product_id, bucket)
        for start in range(0, len(orders), SEED_BATCH):
            async with self._redis.pipeline(transaction=False) as pipe:
                for request_id, order_no, quantity in orders[start : start + SEED_BATCH]:
                    replay = keys.replay(request_id)
                    pipe.hset(replay, mapping={"quantity": quantity, "order_no": order_no, "state": "queued"})
                    pipe.expire(replay, self.ttl_seconds)
                await pipe.execute()

    @translated
    async def mark_queued_if_pending(self, product_id: int, request_id: str, *, bucket: int = 0) -> bool:
        """After a re-publish: a replay record still ``pending`` becomes ``queued`` (two round
        trips, not atomic: only realignment calls it). True when it changed the state."""
        replay = ProductKeys(self._prefix, product_id, bucket).replay(request_id)
        if await self._redis.hget(replay, "state") != "pending":
            return False
        await self._redis.hset(replay, "state", "queued")
        return True
