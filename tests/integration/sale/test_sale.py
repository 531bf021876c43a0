"""The main job, ``flashsale sale``, end to end on the real services (its checker: tests/unit/test_sale_checker.py)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow


def test_a_small_sale_with_payments_holds_every_invariant(small_sale):
    report, _ = small_sale
    assert report["ok"] is True
    assert all(check["ok"] for check in report["invariants"].values())
    assert len(report["invariants"]) == 9
    realigned = report["realignment"]
    assert (realigned["mysql_stock"], realigned["mysql_sold"], realigned["redis_stock_after"]) == (0, 30, 0)
    lifecycle = report["lifecycle"]
    assert lifecycle["paid_units"] + lifecycle["resale"]["resold_units"] == 30
    assert (
        lifecycle["stock_returned"]
        == lifecycle["cancelled_payment_timeout_units"]
        == lifecycle["resale"]["resold_units"]
    )
    paid = report["invariants"]["paid_once"]
    assert paid["buyers_paid"] == paid["paid_orders"] == report["invariants"]["channels_reconciled"]["channel_payments"]
    assert lifecycle["notifications"]["sent"] == paid["buyers_paid"]
    assert lifecycle["reconciliation"] == {"clean": True, "mismatches": {}}
    assert report["ceiling"]["requests"] == 200 and report["ceiling"]["by_status"] == {"202": 200}
