"""What the ops page reads back from the metrics (docs/OPERATIONS.md, "Watching a sale"):
purchase answers by code and each waiting room's figures, summed over every worker's values in
multiprocess mode (:mod:`service.metrics`). Each reads files: call it off the event loop, after
:func:`service.metrics.flush` on it."""

from __future__ import annotations

import glob
import os

from prometheus_client import multiprocess as _multiprocess
from prometheus_client.registry import REGISTRY

from service.metrics import MULTIPROC_ENV, multiprocess, registry


def purchase_totals() -> dict[str, float]:
    """``flashsale_purchase_outcomes_total`` summed by code over every worker in multiprocess mode
    (reads the counters' files only: call it off the event loop, after :func:`flush` on it),
    else over this process."""
    if multiprocess():
        directory = os.environ[MULTIPROC_ENV]
        counters = glob.glob(os.path.join(directory, "counter_*.db"))
        families = _multiprocess.MultiProcessCollector.merge(counters)  # type: ignore[no-untyped-call]
    else:
        families = REGISTRY.collect()
    totals: dict[str, float] = {}
    for family in families:
        if family.name == "flashsale_purchase_outcomes":
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    code = sample.labels["code"]
                    totals[code] = totals.get(code, 0.0) + sample.value
    return totals


_ROOM_FAMILIES = {
    "flashsale_waiting_room_waiting_buyers": "waiting",
    "flashsale_waiting_room_admissions_outstanding": "outstanding",
    "flashsale_waiting_room_units_held": "held",
    "flashsale_waiting_room_admissions_total": "admitted",
    "flashsale_waiting_room_admissions_expired_total": "expired",
}


def waiting_rooms() -> dict[str, dict[str, float | None]]:
    """Per product id (a string): ``waiting``, ``outstanding``, ``held``, ``admitted`` and ``expired`` so
    far, and the wait until admitted, ``wait_p50_seconds`` / ``wait_p99_seconds`` (None before
    the first admission), estimated from the histogram's buckets as Prometheus'
    ``histogram_quantile`` does, over :func:`registry` (reads files in multiprocess mode: call it
    off the event loop after :func:`flush` on it)."""
    rooms: dict[str, dict[str, float | None]] = {}
    buckets: dict[str, list[tuple[float, float]]] = {}
    for family in registry().collect():
        for sample in family.samples:
            product = sample.labels.get("product_id")
            if product is None:
                continue
            if sample.name in _ROOM_FAMILIES:
                rooms.setdefault(product, {})[_ROOM_FAMILIES[sample.name]] = sample.value
            elif sample.name == "flashsale_waiting_room_wait_seconds_bucket":
                buckets.setdefault(product, []).append((float(sample.labels["le"]), sample.value))
    for product, cumulative in buckets.items():
        cumulative.sort()
        room = rooms.setdefault(product, {})
        room["wait_p50_seconds"] = _quantile(0.5, cumulative)
        room["wait_p99_seconds"] = _quantile(0.99, cumulative)
    return rooms


def _quantile(q: float, cumulative: list[tuple[float, float]]) -> float | None:
    """The ``q`` quantile of a histogram's cumulative ``(le, count)`` buckets, interpolated
    linearly inside the bucket it falls in (the +Inf bucket answers its lower bound)."""
    total = cumulative[-1][1] if cumulative else 0.0
    if total <= 0:
        return None
    rank = q * total
    lower, below = 0.0, 0.0
    for bound, count in cumulative:
        if count >= rank:
            if bound == float("inf"):
                return lower
            return lower + (bound - lower) * (rank - below) / (count - below) if count > below else bound
        lower, below = bound, count
    return lower
