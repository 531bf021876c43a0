"""What one realignment pass of a product reports (the CLI, the admin route and the sale print
it), and the metrics it sets."""

from __future__ import annotations

import msgspec

from service import metrics


class RealignReport(msgspec.Struct, frozen=True):
    """One product's realignment. Stock and units in units; ``redis_stock_before`` is None when
    the product was not loaded in Redis. ``drift`` = before - after (None when not loaded).
    ``skipped_stale``: Redis already reflected a newer MySQL state than this pass's snapshot
    (another pass, or units returned by a later cancellation), so it wrote nothing.
    ``redis_unreachable``: no pass ran, Redis did not answer
    (:meth:`~service.domain.stock.realign.Realigner.without_redis`: MySQL's numbers only,
    ``in_flight`` and ``in_flight_units`` -1 for unknown)."""

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


def observe(report: RealignReport) -> None:
    """The pass's drift, units in flight and re-published count, per product."""
    product = str(report.product_id)
    metrics.REALIGN_DRIFT.labels(product).set(report.drift or 0)
    metrics.REALIGN_IN_FLIGHT.labels(product).set(report.in_flight_units)
    metrics.REALIGN_REPUBLISHED.labels(product).inc(report.republished)
