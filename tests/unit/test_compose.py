"""compose.yaml stays valid for people with Docker (checked offline against the Compose spec)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_compose_file_matches_the_compose_spec():
    check = Path(sys.executable).with_name("check-jsonschema")
    result = subprocess.run(
        [str(check), "--builtin-schema", "vendor.compose-spec", str(ROOT / "compose.yaml")],
        check=False,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_compose_runs_every_deployable():
    text = (ROOT / "compose.yaml").read_text()
    for command in (
        '"flashsale", "migrate"',
        '"flashsale", "serve"',
        '"flashsale", "consume"',
        '"flashsale", "realign"',
        '"flashsale", "sweep"',
        '"flashsale", "channel", "serve"',
    ):
        assert command in text
