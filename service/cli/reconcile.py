"""``flashsale reconcile``: the channels' daily bills against the payments table."""

from __future__ import annotations

import sys
from datetime import date

import msgspec
from rich.console import Console
from rich.table import Table

from service.bootstrap import open_job, opened
from service.domain.payments.reconcile import ReconcileReport
from service.log_setup import configure_logging
from service.settings import Settings


async def run_reconcile(settings: Settings, day: date, channel: str | None, apply: bool) -> ReconcileReport:
    """One reconciliation of UTC day ``day`` (see :class:`service.domain.payments.reconcile.Reconciler`)."""
    configure_logging("WARNING")
    async with opened(open_job(settings, publish=False)) as job:
        return await job.reconciler.reconcile(day, channel, apply=apply)


def print_reconciliation(report: ReconcileReport, as_json: bool) -> None:
    """One JSON document, or a summary line per channel and a table of the mismatches."""
    if as_json:
        print(msgspec.json.encode(report).decode(), flush=True)
        return
    console = Console(width=None if sys.stdout.isatty() else 160)
    for channel in report.channels:
        state = f"error: {channel.error}" if channel.error else f"{len(channel.mismatches)} mismatch(es)"
        counts = f"{channel.bill_transactions} in the bill, {channel.matched} matched"
        console.print(f"{report.date} {channel.channel}: {counts}, {state}")
    table = Table(title="mismatches")
    for column in ("kind", "channel", "channel txn", "order", "channel amount", "our amount", "fixed"):
        table.add_column(column)
    for channel in report.channels:
        for m in channel.mismatches:
            cells = (m.kind, m.channel, m.channel_txn_id, m.order_no, m.channel_amount, m.our_amount, m.fixed)
            table.add_row(*("-" if cell is None else str(cell) for cell in cells))
    if table.row_count:
        console.print(table)
    console.print("clean" if report.clean else "not clean")
