"""Stock buckets: a product split over K buckets, each a whole set of keys with its own hash
tag (:mod:`service.domain.stock.buckets`), rebalanced by passes that drain a bucket and fill it
with its share.

Failures raise the vocabulary only (:mod:`.boundary`).
"""

from __future__ import annotations

from service.adapters.redis.boundary import translated
from service.adapters.redis.client import RedisClient
from service.adapters.redis.keys import ProductKeys
from service.adapters.redis.restock_channel import RestockChannel
from service.adapters.redis.scripts import KeyspaceStore, Scripts


class StockBuckets(KeyspaceStore):
    """The stock buckets of the products of one key prefix."""

    def __init__(self, redis: RedisClient, scripts: Scripts, restocks: RestockChannel, key_prefix: str) -> None:
        super().__init__(redis, scripts, key_prefix)
        self._restocks = restocks

    @translated
    async def states(self, product_id: int, buckets: int) -> list[tuple[int | None, bool]]:
        """Per bucket 0 .. ``buckets`` - 1: (units it can sell or None when not loaded, whether a
        rebalancing pass drained it and has not filled it yet). One pipeline (on a cluster, one
        round trip per node)."""
        async with self._redis.pipeline(transaction=False) as pipe:
            for bucket in range(buckets):
                keys = ProductKeys(self._prefix, product_id, bucket)
                pipe.get(keys.stock)
                pipe.hexists(keys.versions, "filling")
            replies = await pipe.execute()
        return [
            (None if stock is None else int(stock), bool(filling))
            for stock, filling in zip(replies[::2], replies[1::2], strict=True)
        ]

    @translated
    async def next_pass(self, product_id: int) -> int:
        """A new rebalancing pass number for the product (1, 2, ...: HINCRBY in bucket 0's
        ``versions``), the ``pass_no`` of :meth:`.stock.Stock.realign` and :meth:`fill`."""
        return int(await self._redis.hincrby(ProductKeys(self._prefix, product_id).versions, "passes", 1))

    async def fill(self, product_id: int, bucket: int, pass_no: int, units: int) -> bool:
        """``lua/bucket_fill.lua``: add ``units`` (the bucket's share of a rebalancing pass) to the
        drained ``bucket`` and end its ``filling`` state. False, writing nothing, when a newer
        pass drained the bucket since, or its stock is gone (run a new pass)."""
        keys = ProductKeys(self._prefix, product_id, bucket)
        filled = bool(
            await self._scripts.run(
                "bucket_fill", keys=[keys.stock, keys.versions], args=[pass_no, units, self._restocks.name, product_id]
            )
        )
        if filled and units > 0:
            self._restocks.announce(product_id)
        return filled
