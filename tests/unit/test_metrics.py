"""The purchase path's local metric sums reach prometheus_client exactly as direct observations
would (they update prometheus_client's own values: a library change breaks this test)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from service import metrics


def _pair(registry: CollectorRegistry, name: str) -> tuple[Histogram, Counter]:
    histogram = Histogram(f"{name}_seconds", "h", ["route"], buckets=(0.001, 0.01, 0.1), registry=registry)
    counter = Counter(f"{name}_events", "c", ["code"], registry=registry)
    return histogram, counter


def _values(registry: CollectorRegistry) -> list[str]:
    return [line for line in generate_latest(registry).decode().splitlines() if "_created" not in line]


def test_flushed_local_sums_expose_like_direct_observations() -> None:
    direct_registry, local_registry = CollectorRegistry(), CollectorRegistry()
    direct_h, direct_c = _pair(direct_registry, "x")
    local_h, local_c = _pair(local_registry, "x")
    histogram = metrics.local_histogram(local_h, "/orders")
    counter = metrics.local_counter(local_c, "sold_out")
    values = [0.0005, 0.001, 0.002, 0.05, 0.5, 7.0, 0.01]
    for value in values:
        direct_h.labels("/orders").observe(value)
        histogram.observe(value)
        direct_c.labels("sold_out").inc()
        counter.inc()

    assert _values(local_registry) != _values(direct_registry)  # nothing flushed yet
    metrics.flush()
    assert _values(local_registry) == _values(direct_registry)
    metrics.flush()  # nothing pending: a second flush adds nothing
    exposed = generate_latest(local_registry).decode()
    assert 'x_seconds_bucket{le="0.001",route="/orders"} 2.0' in exposed
    assert 'x_seconds_count{route="/orders"} 7.0' in exposed
    assert 'x_events_total{code="sold_out"} 7.0' in exposed


def test_purchase_outcome_counters_are_made_once_per_label_set() -> None:
    assert metrics.purchase_outcome("sold_out", "sold_out_flag") is metrics.purchase_outcome(
        "sold_out", "sold_out_flag"
    )
    assert metrics.purchase_outcome("sold_out") is not metrics.purchase_outcome("sold_out", "sold_out_flag")
