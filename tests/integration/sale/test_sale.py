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


def test_every_wave_of_the_sale_went_through_the_locust_crowd_and_came_back_once(small_sale):
    report, _ = small_sale
    crowd = report["crowd"]
    assert list(crowd["waves"]) == ["no-op", "purchase", "payers", "resale"]
    assert crowd["main_wave"] == "purchase" and crowd["bound"] in ("client", "server")
    assert crowd["line"].startswith(f"{crowd['bound']}-bound")
    for name, wave in crowd["waves"].items():
        assert wave["trail"] == {"duplicates": 0, "missing": 0}, name
        assert wave["workers"] == report["run"]["crowd_workers"]
        assert sum(wave["hosts"].values()) == wave["requests"]
        # the sale started the API and consumers, so both sides' CPU is known
        assert wave["client_cpu_us_per_request"] > 0 and wave["server_cpu_us_per_request"] > 0
    assert crowd["waves"]["purchase"]["requests"] == report["responses"]["sent"] == 400
    assert report["invariants"]["trail_complete"]["requests"] == sum(w["requests"] for w in crowd["waves"].values())
