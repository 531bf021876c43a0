"""Rebalancing on demand: a buyer whose stock bucket ran dry while others hold units.

A product of several stock buckets (:mod:`service.domain.stock.buckets`) is sold out only when every
bucket is. When a buyer's bucket answers ``sold_out`` and the others still hold units, the API
process runs a realignment pass of the product (:meth:`Realigner.realign`), which drains every
bucket and fills each with its share of what is left, and the purchase asks once more.

Per process, one pass per product at a time: concurrent buyers of that product wait for the pass
already running (at most :data:`WAIT_SECONDS`); and a product rebalanced less than
:data:`MIN_INTERVAL_SECONDS` ago is not rebalanced again (its remainder may be smaller than its
bucket count, so some buckets rightly hold nothing: their buyers are answered ``unavailable``
until the units are sold or returned). Across processes, the product's realignment lock runs one
pass at a time.
"""

from __future__ import annotations

import asyncio
import time

import structlog

from service.domain.errors import DomainError
from service.domain.stock.realign import Realigner
from service.failures import StoreFailure

log = structlog.get_logger(__name__)

WAIT_SECONDS = 2.0
"""How long a purchase waits for a rebalancing pass before it asks its bucket again (seconds)."""
MIN_INTERVAL_SECONDS = 0.5
"""A product is rebalanced at most once per this many seconds by one process."""


class Rebalancer:
    """Runs rebalancing passes for one API process (single-threaded: its event loop only)."""

    def __init__(self, realigner: Realigner) -> None:
        self._realigner = realigner
        self._running: dict[int, asyncio.Task[None]] = {}
        self._last: dict[int, float] = {}

    async def __call__(self, product_id: int, favour: tuple[int, int]) -> None:
        """Rebalance ``product_id``'s buckets, ``favour`` = (bucket, units) getting at least those
        units where the stock allows (:func:`service.domain.stock.buckets.split`), or wait for the pass
        already running (which may favour another bucket: its buyer's retry starts the next); returns
        within :data:`WAIT_SECONDS` (the pass goes on) and never raises (a failed pass is
        logged; the buyer is answered from what Redis holds)."""
        task = self._running.get(product_id)
        if task is None:
            if time.monotonic() - self._last.get(product_id, -MIN_INTERVAL_SECONDS) < MIN_INTERVAL_SECONDS:
                return
            task = asyncio.create_task(self._pass(product_id, favour))
            self._running[product_id] = task
        await asyncio.wait({task}, timeout=WAIT_SECONDS)

    async def _pass(self, product_id: int, favour: tuple[int, int]) -> None:
        try:
            await self._realigner.realign(product_id, favour=favour)
        except (DomainError, StoreFailure) as exc:
            log.warning("rebalance_failed", product_id=product_id, error=repr(exc))
        finally:
            self._last[product_id] = time.monotonic()
            del self._running[product_id]

    async def aclose(self) -> None:
        """Cancel the passes still running (the lock they hold expires by itself)."""
        for task in list(self._running.values()):
            task.cancel()
        await asyncio.gather(*self._running.values(), return_exceptions=True)
