"""The ops page's purchase answers: the split an operator acts on, and the ring of recent samples
each API worker keeps (service/api/ops_history.py)."""

from __future__ import annotations

from service.api.ops_history import HISTORY_SECONDS, SAMPLE_SECONDS, PurchaseCounts, PurchaseHistory, split


def test_the_split_names_the_rejections_an_operator_acts_on_and_sums_the_rest():
    totals = {
        "accepted": 40.0,
        "sold_out": 20.0,
        "limit_exceeded": 10.0,
        "too_many_requests": 7.0,
        "unavailable": 2.0,
        "sale_not_active": 3.0,
        "product_not_found": 1.0,
        "request_in_progress": 1.0,
    }
    assert split(totals, 1234.5678) == PurchaseCounts(
        at=1234.568, accepted=40, sold_out=20, limit_exceeded=10, too_many_requests=7, unavailable=2, other=5
    )
    assert split({}, 0) == PurchaseCounts(0, 0, 0, 0, 0, 0, 0)


def test_the_ring_keeps_the_last_minutes_oldest_first():
    history = PurchaseHistory()
    kept = int(HISTORY_SECONDS / SAMPLE_SECONDS)
    for n in range(kept + 10):
        history.add(split({"accepted": n}, n * SAMPLE_SECONDS))
    samples = history.samples()
    assert len(samples) == kept
    assert [s.accepted for s in samples] == list(range(10, kept + 10))
