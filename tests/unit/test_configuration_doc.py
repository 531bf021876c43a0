"""docs/CONFIGURATION.md is the document ``python -m service.config_doc`` generates from the settings."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel

from service.config_doc import attribute_docstrings, main, render
from service.settings import AMQPSettings, Settings

DOCUMENT = Path(__file__).resolve().parents[2] / "docs" / "CONFIGURATION.md"


def test_configuration_doc_is_current() -> None:
    assert DOCUMENT.read_text(encoding="utf-8") == render(), "docs/CONFIGURATION.md is stale: run `make docs`"


def test_every_setting_has_a_row_with_a_meaning() -> None:
    rows = [line for line in render().splitlines() if line.startswith("| `FLASHSALE_")]
    names = [row.split("`")[1] for row in rows]
    assert "FLASHSALE_DB__URL" in names and "FLASHSALE_AMQP__RETRY_DELAYS" in names and "FLASHSALE_ENV" in names
    assert len(names) == len(set(names))
    expected = sum(
        len(group.model_fields) if isinstance(group, type) and issubclass(group, BaseModel) else 1
        for group in (field.annotation for field in Settings.model_fields.values())
    )
    assert len(names) == expected
    assert [row for row in rows if row.rstrip().endswith("|  |")] == []


def test_docstrings_under_fields_are_read() -> None:
    assert attribute_docstrings(AMQPSettings)["batch_size"].startswith("Orders one consumer writes")


def test_check_exits_nonzero_on_a_stale_file(tmp_path: Path) -> None:
    stale = tmp_path / "CONFIGURATION.md"
    stale.write_text("# Configuration\n", encoding="utf-8")
    assert main(["--check", str(stale)]) == 1
    stale.write_text(render(), encoding="utf-8")
    assert main(["--check", str(stale)]) == 0
