"""A product a purchase finds lost is realigned next, also when found in the middle of a pass
that already realigned it: a pass over many products takes a while (54 s for 84 products on a
loaded box), and the lost product's buyers got 503 until the pass ended and the next one began."""

from __future__ import annotations

from redis.asyncio import Redis

from service.adapters.redis.stores import RedisStores
from service.domain.stock.realign import Realigner
from service.domain.stock.recovery import Recovery


class _Ordered:
    """The realigner the recovery task uses, recording the order of its products; while it
    realigns ``lose_at``, a purchase finds ``lost`` missing from Redis."""

    def __init__(self, realigner: Realigner, products: list[int], lost: int, lose_at: int, flush) -> None:
        self._realigner = realigner
        self._flush = flush
        self._products = products
        self._lost, self._lose_at = lost, lose_at
        self.recovery: Recovery | None = None
        self.order: list[int] = []

    async def product_ids(self) -> list[int]:
        return self._products

    async def realign(self, product_id: int) -> object:
        self.order.append(product_id)
        if product_id == self._lose_at and self.recovery is not None:
            await self._flush(self._lost)
            self.recovery.not_loaded(self._lost)
        return await self._realigner.realign(product_id)


async def test_a_product_lost_mid_pass_is_realigned_next(
    settings, engine, store: RedisStores, redis: Redis, put_product, new_product_id
):
    products = [new_product_id() for _ in range(6)]
    for product in products:
        await put_product(product, stock=10)
    first, third = products[0], products[2]

    async def lose(product: int) -> None:
        await redis.delete(store.product_keys(product).stock, store.product_keys(product).sale)

    ordered = _Ordered(Realigner(engine, store, settings.realign.grace_seconds, None), products, first, third, lose)
    recovery = Recovery(ordered, store, every_seconds=3600)  # type: ignore[arg-type]
    ordered.recovery = recovery

    assert await recovery.run_once() is True
    # the first product, lost while the pass realigned the third, comes again at once, not after
    # the other three (nor in the next pass)
    assert ordered.order == [*products[:3], first, *products[3:]]
    assert recovery.repairing == set()
    assert await store.stock.units(first, buckets=1) == 10
