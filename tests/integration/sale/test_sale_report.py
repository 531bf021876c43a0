"""``flashsale sale --report DIR``: a small sale writes a self-contained HTML report with charts."""

from __future__ import annotations

import json
import re

import pytest

pytestmark = pytest.mark.slow

PNG = b"\x89PNG\r\n\x1a\n"


def test_a_small_sale_writes_its_report_with_charts(small_sale):
    report, directory = small_sale
    assert report["ok"] is True

    charts = {name: directory / f"{name}.png" for name in ("timeline", "latency", "outcomes")}
    for path in charts.values():
        data = path.read_bytes()
        assert data.startswith(PNG) and len(data) > 10_000, path  # a drawn chart, not an empty canvas
    page = (directory / "report.html").read_text()
    # self-contained: every chart embedded, nothing loaded from elsewhere
    embedded = re.findall(r'<img id="(\w+)" alt="\w+" src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert {name for name, _ in embedded} == set(charts)
    assert not re.search(r'(src|href)="(https?:)?//', page)
    invariants = re.search(r'<table id="invariants">(.*?)</table>', page, re.S)
    assert invariants is not None
    assert len(report["invariants"]) >= 7
    assert invariants.group(1).count("<td>PASS</td>") == len(report["invariants"])
    assert "FAIL" not in invariants.group(1)
    assert re.search(r"p50 [\d.]+ ms, p95 [\d.]+ ms, p99 [\d.]+ ms", page)
    tables = " ".join(re.findall(r"<table.*?</table>", page, re.S))
    assert not re.search(r"\bTrue\b|\bFalse\b|\bNone\b|\{|service\.", tables)  # words, not Python


def test_the_timeline_runs_from_the_purchase_wave_to_the_end_of_the_run(small_sale):
    report, directory = small_sale
    timeline = json.loads((directory / "timeline.json").read_text())
    phases = timeline["phases"]
    assert "no-op" not in phases and phases["purchase"][0] == 0
    assert set(phases) >= {"purchase", "payments", "resale"}  # the run paid and resold
    rows = timeline["rows"]
    # sampled through the lifecycle phases: the rows reach the run's final count after the resale
    assert rows["ys"][-1] == sum(report["orders_by_status"].values())
    assert rows["xs"][-1] >= phases["resale"][1] and timeline["end"] == rows["xs"][-1]
    assert len(rows["xs"]) >= 20
    assert timeline["accepted"]["ys"][-1] == report["invariants"]["one_order_per_accepted_request"]["accepted_orders"]
