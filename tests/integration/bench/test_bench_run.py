"""``flashsale bench`` end to end: a short run measures every row (shape only: benchmarks are not
tests, no timing is asserted)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from service.bench.rows import DRAIN_ROWS, HTTP_ROWS, TARGETS


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("wrk") is None, reason="wrk not installed (scripts/ensure-tools)")
def test_a_short_bench_measures_every_row():
    result = subprocess.run(
        [str(Path(sys.executable).with_name("flashsale")), "bench", "--duration", "1", "--backlog", "2000", "--json"],
        check=False,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert {"run_id", "machine", "options", "rows", "targets"} <= report.keys()
    assert report["machine"]["nproc"] >= 1 and report["machine"]["cpu_model"]
    keys = [r.key for r in HTTP_ROWS] + [key for key, _, _ in DRAIN_ROWS]
    assert [row["key"] for row in report["rows"]] == keys
    for row in report["rows"]:
        assert row["rate"] > 0 and row["count"] > 0, row
        assert row["cpu"]["machine"] >= 0
    assert len(report["targets"]) == len(TARGETS)
    assert all(t["ratio"] is not None for t in report["targets"])
    assert 0 < report["accept_ceiling"] < 1
    assert report["options"]["consumers"] == 2
    # 2,000 orders of 1,000 buyers: the consumers apply every one, as the raw writers do (the drain
    # products' per-user limit once was 1, and the row measured the limit_exceeded path instead)
    consumer = next(row for row in report["rows"] if row["key"] == "consumer")
    assert "rejected" not in consumer["note"], consumer["note"]
