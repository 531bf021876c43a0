"""``flashsale sale --report DIR``: a small sale writes a self-contained HTML report with charts."""

from __future__ import annotations

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
