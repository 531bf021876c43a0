"""``flashsale sale --report DIR`` without matplotlib (the optional ``charts`` extra): the page
is written all the same, with one line in place of the charts saying how to get them."""

from __future__ import annotations

from toolkit.sale import charts
from toolkit.sale.facts import Measured
from toolkit.sale.plan import Answer, Wave

REPORT = {
    "run": {"run_id": "sale_x", "requests": 2, "users": 2, "stock": 1, "product_id": 7},
    "ok": True,
    "invariants": {},
    "performance": {"requests": 2},
    "ceiling": {},
    "orders_by_status": {},
    "realignment": {},
    "lifecycle": None,
    "fairness": None,
    "crowd": None,
}


def test_without_matplotlib_the_report_says_charts_are_skipped(tmp_path, monkeypatch):
    def no_charts(*_: object) -> str:
        raise AssertionError("charts drawn without matplotlib")

    monkeypatch.setattr(charts, "charts_available", lambda: False)
    monkeypatch.setattr(charts, "_charts", no_charts)
    answers = [Answer(202, "accepted", None, None, 0.01), Answer(409, "sold_out", None, None, 0.02)]
    measured = Measured(Wave([], answers, 1.0), None, "disabled", None, 0.0, 1.0, None, None)  # type: ignore[arg-type]
    page = charts.write_report(tmp_path / "report", REPORT, measured).read_text(encoding="utf-8")
    assert charts.CHARTS_SKIPPED.replace("'", "&#x27;") in page and "<img" not in page
    assert "every invariant holds" in page and "p50 " in page
    assert "\n" not in charts.CHARTS_SKIPPED and "flashsale[charts]" in charts.CHARTS_SKIPPED
    assert not list((tmp_path / "report").glob("*.png"))
