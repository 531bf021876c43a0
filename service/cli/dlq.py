"""``flashsale dlq``: list, show, redrive and purge dead-lettered order messages."""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

import click

from service.cli.common import load_settings, run

if TYPE_CHECKING:  # the connections' modules load only when a command runs
    from rich.console import Console

    from service.domain.fulfilment.dead_letters import DeadLetterService, DeadLetterView, Purged

T = TypeVar("T")


def _with_service(use: Callable[[DeadLetterService], Awaitable[T]]) -> T:
    """Open the deployment's connections, run ``use`` on its dead-letter service, close them.
    An unknown id ends the command with exit status 1 and one line on stderr."""
    from service.adapters.dead_letters import DeadLetterQueue
    from service.bootstrap import open_job, opened
    from service.domain.fulfilment.dead_letters import DeadLetterNotFound, DeadLetterService
    from service.log_setup import configure_logging

    settings = load_settings()

    async def go() -> T:
        configure_logging("WARNING")
        async with opened(open_job(settings)) as job:
            service = DeadLetterService(DeadLetterQueue(settings.amqp), job.engine, job.store, job.realigner)
            return await use(service)

    try:
        return run(go())
    except DeadLetterNotFound as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)


def _console() -> Console:
    from rich.console import Console

    return Console(width=None if sys.stdout.isatty() else 160)


def _print_views(views: list[DeadLetterView], title: str, as_json: bool) -> None:
    import msgspec
    from rich.table import Table

    if as_json:
        click.echo(msgspec.json.encode(views).decode())
        return
    table = Table(title=f"{title} ({len(views)})")
    for column in ("id", "reason", "count", "copies", "died in", "died at", "order", "product", "user", "qty", "error"):
        table.add_column(column)
    for view in views:
        order = view.order
        table.add_row(
            view.id,
            view.reason or "-",
            str(view.count),
            str(view.copies),
            view.queue or "-",
            view.died_at.isoformat() if view.died_at else "-",
            order.order_no if order else "-",
            str(order.product_id) if order else "-",
            order.user_id if order else "-",
            str(order.quantity) if order else "-",
            view.error or "",
        )
    _console().print(table)


@click.group()
def dlq() -> None:
    """The dead-letter queue: why orders died there, redrive them or purge them."""


@dlq.command("list")
@click.option("--json", "as_json", is_flag=True, help="One JSON array.")
def list_(as_json: bool) -> None:
    """Every dead-lettered message: its id, the x-death reason and count, the order it carries."""
    _print_views(_with_service(lambda service: service.entries()), "dead-lettered", as_json)


@dlq.command()
@click.argument("dead_letter_id", metavar="ID")
@click.option("--json", "as_json", is_flag=True, help="One JSON array.")
def show(dead_letter_id: str, as_json: bool) -> None:
    """One dead-lettered message (every copy with this ID), its body included. Exit 1 if none."""
    import msgspec

    views = _with_service(lambda service: service.show(dead_letter_id))
    if as_json:
        click.echo(msgspec.json.encode(views).decode())
        return
    for view in views:
        click.echo(msgspec.json.format(msgspec.json.encode(view)).decode())


@dlq.command()
@click.argument("ids", nargs=-1, metavar="[ID]...")
@click.option("--all", "every", is_flag=True, help="Every dead-lettered message.")
@click.option("--json", "as_json", is_flag=True, help="One JSON array.")
def redrive(ids: tuple[str, ...], every: bool, as_json: bool) -> None:
    """Put messages back on the order queue (an order already applied stays applied once).
    Exit 1, moving nothing, if an ID names no message."""
    if every == bool(ids):
        raise click.UsageError("give IDs or --all (not both)")
    views = _with_service(lambda service: service.redrive(None if every else set(ids)))
    _print_views(views, "redriven", as_json)


@dlq.command()
@click.argument("ids", nargs=-1, required=True, metavar="ID...")
@click.option("--json", "as_json", is_flag=True, help="One JSON array.")
def purge(ids: tuple[str, ...], as_json: bool) -> None:
    """Remove messages for good; the stock their orders reserved goes back on sale (through a
    realignment pass). Exit 1, removing nothing, if an ID names no message."""
    import msgspec
    from rich.table import Table

    purged: list[Purged] = _with_service(lambda service: service.purge(set(ids)))
    if as_json:
        click.echo(msgspec.json.encode(purged).decode())
        return
    table = Table(title=f"purged ({len(purged)})")
    for column in ("id", "order", "product", "qty", "outcome", "redis stock after"):
        table.add_column(column)
    for item in purged:
        order = item.order
        table.add_row(
            item.id,
            order.order_no if order else "-",
            str(order.product_id) if order else "-",
            str(order.quantity) if order else "-",
            item.outcome.value,
            str(item.realign.redis_stock_after) if item.realign else "-",
        )
    _console().print(table)
