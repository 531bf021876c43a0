"""The purchase answers the ops page charts (docs/OPERATIONS.md#watching-a-sale): totals so far
split into the rejections an operator acts on, and a ring of recent totals kept by each API
worker, so the page shows the last minutes as soon as it opens.

Every worker samples the same thing: ``flashsale_purchase_outcomes_total`` summed over every
worker of its server (the multiprocess files of :mod:`service.metrics`), every
:data:`SAMPLE_SECONDS`. Whichever worker answers the page, its ring covers the whole server,
back to when that worker started (at most :data:`HISTORY_SECONDS`). Several ``flashsale serve``
hosts each chart their own workers, as ``/metrics`` counts them.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import structlog
from litestar.config.app import AppConfig
from litestar.di import Provide

from service import metrics, metrics_readings
from service.runtime import stop_task
from service.settings import Settings

log = structlog.get_logger(__name__)

SAMPLE_SECONDS = 5.0
HISTORY_SECONDS = 600.0
REJECTIONS = ("sold_out", "limit_exceeded", "too_many_requests", "unavailable")
"""The rejection codes the page shows apart; every other code counts as ``other``."""


class PurchaseCounts(msgspec.Struct):
    """Purchase answers so far at ``at`` (Unix seconds, the server's clock), every API worker of
    the server summed: ``accepted``, the rejections of :data:`REJECTIONS` (``too_many_requests``:
    rate limited), and ``other`` (every other code: ``sale_not_active``, ``product_not_found``,
    ``request_in_progress``, ...)."""

    at: float
    accepted: int
    sold_out: int
    limit_exceeded: int
    too_many_requests: int
    unavailable: int
    other: int


def split(totals: dict[str, float], at: float) -> PurchaseCounts:
    """``totals`` (answers by code, :func:`service.metrics_readings.purchase_totals`) as :class:`PurchaseCounts`."""
    known = {"accepted", *REJECTIONS}
    named = {code: int(totals.get(code, 0)) for code in known}
    other = int(sum(count for code, count in totals.items() if code not in known))
    return PurchaseCounts(at=round(at, 3), other=other, **named)


async def purchase_totals() -> dict[str, float]:
    """The server's purchase answers so far by code (this worker's local sums flushed first)."""
    metrics.flush()  # on the event loop: the local sums are the loop's
    return await asyncio.to_thread(metrics_readings.purchase_totals)


class PurchaseHistory:
    """The last :data:`HISTORY_SECONDS` of :class:`PurchaseCounts`, one every :data:`SAMPLE_SECONDS`
    (:func:`sampling` adds them), oldest first."""

    def __init__(self) -> None:
        self._samples: deque[PurchaseCounts] = deque(maxlen=int(HISTORY_SECONDS / SAMPLE_SECONDS))

    def add(self, sample: PurchaseCounts) -> None:
        self._samples.append(sample)

    def samples(self) -> list[PurchaseCounts]:
        return list(self._samples)


@contextlib.asynccontextmanager
async def sampling(history: PurchaseHistory) -> AsyncIterator[None]:
    """While the block runs: a sample into ``history`` at once, then every :data:`SAMPLE_SECONDS`."""

    async def sample() -> None:
        while True:
            try:
                history.add(split(await purchase_totals(), time.time()))
            except OSError as exc:  # a metrics file unreadable: a gap in the chart, not a dead sampler
                log.warning("ops_history_sample_failed", error=repr(exc))
            await asyncio.sleep(SAMPLE_SECONDS)

    task = asyncio.create_task(sample())
    try:
        yield
    finally:
        await stop_task(task)


HISTORY = "purchase_history"
"""The dependency name of the worker's :class:`PurchaseHistory`."""


def install(app_config: AppConfig, settings: Settings) -> None:
    """The worker's :class:`PurchaseHistory` as dependency :data:`HISTORY`, sampled while the app
    runs when metrics are on (``settings.metrics.enabled``; off, it stays empty)."""
    history = PurchaseHistory()
    app_config.dependencies[HISTORY] = Provide(lambda: history, sync_to_thread=False)
    if settings.metrics.enabled:

        @contextlib.asynccontextmanager
        async def lifespan(_: Any) -> AsyncIterator[None]:
            async with sampling(history):
                yield

        app_config.lifespan.append(lifespan)
