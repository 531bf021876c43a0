"""``flashsale realign``: the stock realignment job (one pass, or ``--watch`` until SIGTERM).

The pass itself is :class:`service.domain.stock.realign.Realigner`; this module only opens the
connections, repeats and prints the report (:func:`print_reports`, also the output of
``flashsale product set`` and of the sale's realignment).
"""

from __future__ import annotations

import sys

import msgspec
from rich.console import Console
from rich.table import Table

from consumers import worker_metrics
from service.domain.errors import ProductNotFound
from service.domain.stock.realign_report import RealignReport
from service.failures import is_outage
from service.log_setup import configure_logging
from service.runtime import watch
from service.settings import Settings
from service.startup import job_opened


async def run_realign(
    settings: Settings,
    product_id: int | None,
    dry_run: bool,
    every: float | None,
    as_json: bool,
    metrics_port: int | None = None,
) -> int:
    """Realign ``product_id`` (or every product); repeat every ``every`` seconds when given.
    ``dry_run`` reports without writing. With ``every``, ``/metrics`` is served on
    ``metrics_port`` (default ``FLASHSALE_METRICS__PORT``; 0: not served). Returns the exit
    status: 0, or 1 for an unknown product.

    With ``every`` it outlives store outages: started while Redis, RabbitMQ or MySQL is away it
    waits for them, and a pass that meets an outage is tried again with back-off (see
    :func:`service.runtime.watch`); one log line when an outage begins, one when it ends."""
    configure_logging("WARNING")
    publish = not dry_run
    async with job_opened(settings, publish=publish, wait=every is not None) as job:
        if job is None:  # stopped while waiting for a store
            return 0
        realigner = job.realigner

        async def one_pass() -> None:
            print_reports(await realigner.realign_pass(product_id, dry_run), as_json)

        try:
            async with worker_metrics.exposed(settings, metrics_port if every else 0, sample_queues=False):
                await watch(every, one_pass, survive=is_outage, event="realign_pass")
        except ProductNotFound as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
    return 0


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
