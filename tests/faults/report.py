"""The fault suite's table: one :class:`Row` per case (its columns: tests/faults/harness.py),
as the report prints it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Row:
    """One row of the table (see the module docstring); ``details`` go to the JSON report."""

    fault: str
    accepted: int = 0
    rows: int = 0
    lost: int = 0
    duplicate: int = 0
    no_202: int = 0
    oversold: int = 0
    over_limit: int = 0
    stranded: int = 0
    recovered: bool = False
    time_to_recover: float | None = None
    share_503: float = 0.0
    longest_503: float = 0.0  # seconds, one worker
    failed_checks: list[str] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return (
            self.lost == 0
            and self.duplicate == 0
            and self.no_202 == 0
            and self.oversold == 0
            and self.over_limit == 0
            and self.stranded == 0
            and self.recovered
        )


def format_row(row: Row) -> list[str]:
    recover = "-" if row.time_to_recover is None else f"{row.time_to_recover:.1f} s"
    return [
        row.fault,
        str(row.accepted),
        str(row.rows),
        str(row.lost),
        str(row.duplicate),
        str(row.no_202),
        str(row.oversold),
        str(row.over_limit),
        str(row.stranded),
        "yes" if row.recovered else "no",
        recover,
        f"{row.share_503:.1%}",
        f"{row.longest_503:.1f} s",
        "; ".join(row.failed_checks)[:400],
    ]


HEADERS = [
    "fault",
    "accepted",
    "rows",
    "lost",
    "duplicate",
    "no 202",
    "oversold",
    "over-limit",
    "stranded",
    "recovered by itself",
    "time to recover",
    "503 share",
    "longest 503 window",
    "failed checks",
]
