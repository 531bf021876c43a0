"""What one realignment pass of a product reports (the CLI, the admin route and the sale print
it), and the metrics it sets."""

from __future__ import annotations

import msgspec
from sqlalchemy.ext.asyncio import AsyncEngine

from db.queries import inventory
from service import metrics
from service.domain.errors import ProductNotFound


class RealignReport(msgspec.Struct, frozen=True):
    """One product's realignment. Stock and units in units; ``redis_stock_before`` is None when
    the product was not loaded in Redis. ``drift`` = before - after (None when not loaded).
    ``skipped_stale``: Redis already reflected a newer MySQL state than this pass's snapshot
    (another pass, or units returned by a later cancellation), so it wrote nothing.
    ``redis_unreachable``: no pass ran, Redis did not answer
    (:func:`without_redis`: MySQL's numbers only,
    ``in_flight`` and ``in_flight_units`` -1 for unknown). ``redis_held``: units the waiting room
    keeps for admitted buyers (docs/ARCHITECTURE.md, "Waiting room"), neither in the Redis stock
    nor sold."""

    product_id: int
    mysql_stock: int
    mysql_sold: int
    redis_stock_before: int | None
    redis_stock_after: int
    in_flight: int
    in_flight_units: int
    drift: int | None
    resolved_dropped: int
    republished: int
    dry_run: bool
    skipped_stale: bool = False
    redis_unreachable: bool = False
    redis_held: int = 0


def observe(report: RealignReport) -> None:
    """The pass's drift, units in flight and re-published count, per product."""
    product = str(report.product_id)
    metrics.REALIGN_DRIFT.labels(product).set(report.drift or 0)
    metrics.REALIGN_IN_FLIGHT.labels(product).set(report.in_flight_units)
    metrics.REALIGN_REPUBLISHED.labels(product).inc(report.republished)


async def without_redis(engine: AsyncEngine, product_id: int) -> RealignReport:
    """The report of a pass that could not run because Redis did not answer: MySQL's stock
    and sold only (a product in stock mode ``database`` sells from MySQL alone; the next
    pass once Redis answers loads it).

    Raises:
        ProductNotFound: the product has no inventory row in MySQL.
    """
    async with engine.connect() as conn:
        row = (await conn.execute(inventory.STOCK_AND_SOLD, {"p": product_id})).first()
    if row is None:
        raise ProductNotFound(product_id)
    return RealignReport(
        product_id=product_id,
        mysql_stock=row.stock,
        mysql_sold=row.sold,
        redis_stock_before=None,
        redis_stock_after=0,
        in_flight=-1,
        in_flight_units=-1,
        drift=None,
        resolved_dropped=0,
        republished=0,
        dry_run=False,
        redis_unreachable=True,
    )
