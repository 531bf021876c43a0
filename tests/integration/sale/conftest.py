"""One small sale with payments and ``--report``, shared by the sale's tests (a sale is the
suite's slowest step: its invariants and its report are checked on the same run)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def small_sale(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    """``flashsale sale --json --report DIR`` on 30 units with payments: (its JSON report, DIR)."""
    directory = tmp_path_factory.mktemp("sale") / "report"
    result = subprocess.run(
        [
            str(Path(sys.executable).with_name("flashsale")),
            "sale",
            "--json",
            "--stock",
            "30",
            "--requests",
            "400",
            "--users",
            "150",
            "--concurrency",
            "32",
            "--noop-requests",
            "200",
            "--pay-share",
            "0.5",
            "--payment-window",
            "2",
            "--report",
            str(directory),
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout), directory
