"""Terminal output shared by the commands: the realignment report as a rich table or JSON."""

from __future__ import annotations

import sys

import msgspec
from rich.console import Console
from rich.table import Table

from service.domain.stock.realign import RealignReport


def print_reports(reports: list[RealignReport], as_json: bool, console: Console | None = None) -> None:
    """A rich table, or one JSON array on stdout."""
    if as_json:
        print(msgspec.json.encode(reports).decode(), flush=True)
        return
    table = Table(title="realignment" + (" (dry run)" if reports and reports[0].dry_run else ""))
    for column in (
        "product",
        "mysql stock",
        "sold",
        "redis before",
        "redis after",
        "in flight",
        "units in flight",
        "drift",
        "resolved dropped",
        "republished",
    ):
        table.add_column(column, justify="right")
    for r in reports:
        table.add_row(
            *map(
                lambda value: "-" if value is None else str(value),  # None: not loaded in Redis before
                (
                    r.product_id,
                    r.mysql_stock,
                    r.mysql_sold,
                    r.redis_stock_before,
                    r.redis_stock_after,
                    r.in_flight,
                    r.in_flight_units,
                    r.drift,
                    r.resolved_dropped,
                    r.republished,
                ),
            )
        )
    out = console or Console(width=None if sys.stdout.isatty() else 160)
    out.print(table)
    for r in reports:
        if r.redis_unreachable:
            out.print(
                f"product {r.product_id}: Redis did not answer; MySQL is written and sells it (stock mode "
                "database), Redis is loaded by the next realignment pass (in flight: -1 = unknown)."
            )
