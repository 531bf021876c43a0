"""``flashsale product set`` when Redis does not answer: the rollback plan for Redis-backed stock
(switch the hot product to stock mode ``database`` and keep selling; docs/OPERATIONS.md) needs
MySQL only.

The normal path opens every store (:func:`service.bootstrap.opened`): Redis, RabbitMQ, MySQL.
With Redis unreachable, a product set to ``--stock-mode database`` is written here on MySQL
alone: the switch's Redis steps (the ``moved`` marker, the drain of reservations in flight)
cannot run and are skipped (:func:`service.domain.stock.modes.switch_to_database`), the mode is
written with the product row locked, and the Redis load is left to the next realignment pass.
"""

from __future__ import annotations

from service.adapters.redis.stores import make_stores
from service.domain.stock.catalog import ProductInput, set_product
from service.domain.stock.realign import Realigner
from service.domain.stock.realign_report import RealignReport
from service.failures import StoreFailure
from service.settings import Settings


async def redis_answers(settings: Settings) -> bool:
    """True when the Redis of ``settings`` answers PING (within its connect and socket timeouts)."""
    stores = make_stores(settings)
    try:
        return await stores.ping()
    except StoreFailure:
        return False
    finally:
        await stores.aclose()


async def set_product_without_redis(settings: Settings, product_id: int, data: ProductInput) -> RealignReport:
    """:func:`set_product` on MySQL alone (a Redis client that is never loaded: each of its calls
    fails as the unreachable Redis does, and the switch skips what needs Redis; no publisher, so
    nothing is re-published: ``realign --watch`` does that once Redis answers).

    Raises:
        InvalidProduct: as :func:`set_product`.
        StoreUnavailable: the product is in stock mode ``redis`` after all.
    """
    from db.engine import make_engine

    engine = make_engine(settings.db.url, pool_size=2, max_overflow=2)
    store = make_stores(settings)
    try:
        realigner = Realigner(engine, store, settings.realign.grace_seconds)
        return await set_product(engine, store, realigner, product_id, data)
    finally:
        await store.aclose()
        await engine.dispose()
