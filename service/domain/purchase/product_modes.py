"""Which stock mode each product sells in, as one API process knows it (:class:`ProductModes`).

Learned from MySQL per product and process, then kept for :data:`MODE_TTL_SECONDS`: the
purchase path reads it without a MySQL query (one every few seconds per product and process).
It needs no invalidation message to be safe, because both sides refuse what is not theirs:
``reserve.lua`` answers ``moved`` for a product whose Redis slot carries the ``database``
marker, and the ``database``-mode transaction answers ``MOVED`` for a product MySQL says is in
``redis`` mode; the purchase path then :meth:`ProductModes.refresh`es the entry, and so it does
when Redis fails (a switch to ``database`` made while Redis was down left no marker there). The
time limit covers what neither side can say: a switch made while Redis was unreachable, seen by
a process that had no purchase of the product meanwhile, once Redis answers again (until a
realignment pass writes the marker).

When a product's kept mode expires under load, the purchases that find it expired share one MySQL
read (:meth:`ProductModes.load`) instead of each sending its own.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import structlog
from sqlalchemy.ext.asyncio import AsyncEngine

from db.models import StockMode
from db.queries import products
from service.domain.errors import ProductNotFound
from service.failures import StoreFailure

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class ProductMode:
    """How a product sells: its stock mode, whether a purchase needs an order token, and its
    stock buckets K in Redis (:mod:`service.domain.stock.buckets`)."""

    stock_mode: StockMode
    require_token: bool = False
    buckets: int = 1


_REDIS = ProductMode(StockMode.REDIS)
MODE_TTL_SECONDS = 5.0
"""How long a process keeps a product's stock mode before it reads MySQL again."""
SHARED_READ_SECONDS = 1.0
"""How long a product's read in flight is shared: a caller that finds one older starts a new one,
and a caller waiting on one gives up on it at this age and joins (or starts) the next, so a
read whose connection stalled holds its product's purchases this long, not until TCP gives up."""


class ProductModes:
    """Per-process map product id -> :class:`ProductMode`. Without an engine every product is taken
    to be in ``redis`` mode (Redis then decides, and answers ``moved`` if it is not)."""

    def __init__(self, engine: AsyncEngine | None, ttl_seconds: float = MODE_TTL_SECONDS) -> None:
        self._engine = engine
        self._ttl = ttl_seconds
        self._modes: dict[int, tuple[ProductMode, float]] = {}
        self._loading: dict[int, tuple[asyncio.Task[ProductMode], float]] = {}

    @property
    def reads_mysql(self) -> bool:
        """False without an engine: every product is then taken to be in ``redis`` mode."""
        return self._engine is not None

    def cached(self, product_id: int) -> ProductMode | None:
        """The product's kept mode while it is fresh, or None (then :meth:`refresh`): no
        coroutine on the hot path."""
        kept = self._modes.get(product_id)
        if kept is None or time.monotonic() >= kept[1]:
            return None
        return kept[0]

    async def mode(self, product_id: int) -> ProductMode:
        """The product's mode, from the cache or else from MySQL (:meth:`load`).

        Raises:
            ProductNotFound: MySQL has no such product.
        """
        cached = self.cached(product_id)
        return cached if cached is not None else await self.load(product_id)

    async def load(self, product_id: int) -> ProductMode:
        """The product's mode read from MySQL by the read in flight for it, or by a new one
        (:meth:`refresh`) when none is: the purchases that find it expired at the same
        moment wait for one query, not one each (a stampede's burst of them would otherwise
        hold the engine's pool every ``MODE_TTL_SECONDS``). A read is shared for
        :data:`SHARED_READ_SECONDS`; a caller still waiting then moves to the next read (one per
        product at a time, on another pooled connection). A caller cancelled while it waits
        leaves the read to the others.

        Raises:
            ProductNotFound: MySQL has no such product.
        """
        loop = asyncio.get_running_loop()
        while True:
            now = loop.time()
            loading = self._loading.get(product_id)
            if loading is None or now >= loading[1] + SHARED_READ_SECONDS:
                if loading is not None:
                    log.warning("route_read_slow", product_id=product_id, seconds=SHARED_READ_SECONDS)
                task = asyncio.ensure_future(self.refresh(product_id))
                loading = self._loading[product_id] = (task, now)
                task.add_done_callback(lambda done: self._loaded(product_id, done))
            task, started = loading
            try:
                async with asyncio.timeout_at(started + SHARED_READ_SECONDS):
                    return await asyncio.shield(task)
            except TimeoutError:
                if task.done():  # it finished as the deadline passed
                    return task.result()

    def _loaded(self, product_id: int, done: asyncio.Task[ProductMode]) -> None:
        loading = self._loading.get(product_id)
        if loading is not None and loading[0] is done:
            del self._loading[product_id]
        if not done.cancelled():
            done.exception()  # retrieved here too, for a read whose callers all went

    async def refresh(self, product_id: int) -> ProductMode:
        """Read the product's mode from MySQL now and keep it (after Redis or MySQL refused the
        kept mode: a read already in flight may have started before the change). When MySQL
        does not answer, the mode kept before (kept again for a while, so a lost MySQL costs
        one attempt per product every few seconds), else the ``redis`` mode (not kept): Redis
        sells without MySQL, and refuses what is not its own.

        Raises:
            ProductNotFound: MySQL has no such product.
        """
        if self._engine is None:
            return _REDIS
        try:
            async with self._engine.connect() as conn:
                row = (await conn.execute(products.ROUTING, {"id": product_id})).first()
        except StoreFailure as exc:
            log.warning("route_unavailable", product_id=product_id, error=repr(exc))
            kept = self._modes.get(product_id)
            if kept is None:
                return _REDIS
            self._modes[product_id] = (kept[0], time.monotonic() + self._ttl)
            return kept[0]
        if row is None:
            self._modes.pop(product_id, None)
            raise ProductNotFound(product_id)
        known = ProductMode(StockMode(row.stock_mode), bool(row.require_token), int(row.buckets))
        self._modes[product_id] = (known, time.monotonic() + self._ttl)
        return known

    def forget(self, product_id: int) -> None:
        """Drop the product's entry (its next purchase reads MySQL again)."""
        self._modes.pop(product_id, None)
