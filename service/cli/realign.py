"""Realignment and product loading from the command line (short-lived connections of their own)."""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import msgspec
from rich.console import Console
from rich.table import Table

from db.engine import make_engine
from service.adapters.broker import Publisher
from service.bootstrap import make_store
from service.domain.catalog import ProductInput, set_product
from service.domain.realign import Realigner, RealignReport
from service.log_setup import configure_logging
from service.settings import Settings


async def stopped(seconds: float) -> bool:
    """Sleep ``seconds`` for a ``--watch`` loop; True as soon as SIGTERM or SIGINT arrives."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await asyncio.wait_for(stop.wait(), seconds)
    except TimeoutError:
        return False
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
    return True


@asynccontextmanager
async def open_realigner(settings: Settings, publish: bool = True) -> AsyncIterator[Realigner]:
    """A :class:`Realigner` on fresh connections, closed on exit (publisher only when ``publish``)."""
    engine = make_engine(settings.db.url, pool_size=settings.db.pool_size, max_overflow=settings.db.max_overflow)
    store = make_store(settings)
    publisher = Publisher(settings.amqp) if publish else None
    try:
        if publisher is not None:
            await publisher.connect()
        yield Realigner(engine, store, settings.realign.grace_seconds, publisher)
    finally:
        if publisher is not None:
            await publisher.close()
        await store.aclose()
        await engine.dispose()


def print_reports(reports: list[RealignReport], as_json: bool, console: Console | None = None) -> None:
    """A rich table, or one JSON array on stdout."""
    if as_json:
        print(msgspec.json.encode(reports).decode(), flush=True)
        return
    table = Table(title="realignment" + (" (dry run)" if reports and reports[0].dry_run else ""))
    for column in ("product", "mysql stock", "sold", "redis before", "redis after", "in flight", "units in flight", "drift", "resolved dropped", "republished"):
        table.add_column(column, justify="right")
    for r in reports:
        table.add_row(
            *map(
                lambda value: "-" if value is None else str(value),  # None: not loaded in Redis before
                (r.product_id, r.mysql_stock, r.mysql_sold, r.redis_stock_before, r.redis_stock_after,
                 r.in_flight, r.in_flight_units, r.drift, r.resolved_dropped, r.republished),
            )
        )
    (console or Console(width=None if sys.stdout.isatty() else 160)).print(table)


async def run_realign(settings: Settings, product_id: int | None, dry_run: bool, watch: float | None, as_json: bool) -> int:
    """``flashsale realign``; returns the exit status (1 when the product does not exist)."""
    configure_logging("WARNING")
    async with open_realigner(settings, publish=not dry_run) as realigner:
        while True:
            try:
                reports = (
                    [await realigner.realign(product_id, dry_run)]
                    if product_id is not None
                    else await realigner.realign_all(dry_run)
                )
            except LookupError as exc:
                print(f"error: {exc}", file=sys.stderr)
                return 1
            print_reports(reports, as_json)
            if watch is None or await stopped(watch):
                return 0


async def set_product_cli(settings: Settings, product_id: int, data: ProductInput) -> RealignReport:
    """``flashsale product set``."""
    configure_logging("WARNING")
    async with open_realigner(settings) as realigner:
        return await set_product(realigner.engine, realigner, product_id, data)
