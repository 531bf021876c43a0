"""The processes of a deployment: ``serve`` (the API), ``consume`` (queued orders to MySQL),
``realign`` (Redis stock from MySQL) and ``sweep`` (unpaid orders past the payment window)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import click

from service.cli.common import load_settings, metrics_port_option, run

if TYPE_CHECKING:
    from service.settings import AMQPSettings


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535), help="TCP port.")
@click.option("--workers", default=2, show_default=True, type=click.IntRange(1, 64), help="granian worker processes.")
@click.option(
    "--share-port",
    is_flag=True,
    help="Serve even where another server listens on the port: the kernel splits the connections "
    "between them (SO_REUSEPORT). Without it a busy port ends the command with exit code 2.",
)
def serve(host: str, port: int, workers: int, share_port: bool) -> None:
    """Run the purchase API (granian, WORKERS processes). Asks Redis, RabbitMQ and MySQL once
    first: a store that refuses as configured (wrong credentials, unknown database) ends it with
    one line and exit code 2; a store that does not answer (down, restarting) is named in one
    line and the API starts all the same: /api/v1/health/ready answers 503 and purchases
    503 unavailable until each worker has connected (it keeps trying with back-off). Fewer free
    order-number shards than WORKERS (at most 90 worker processes per key prefix), before or
    while the workers start, ends it with one line and exit code 3. A port another process
    listens on ends it with one line and exit code 2, unless --share-port."""
    from service.api.serving import serve_api

    settings = load_settings()
    settings.require_secrets()
    problem = serve_api(
        settings,
        "service.api.app:create_app",
        host,
        port,
        workers,
        lambda line: click.echo(line, err=True),
        share_port=share_port,
    )
    if problem:
        from service.api.no_shard import EXIT_NO_SHARD  # not earlier: it imports prometheus_client

        click.echo(f"flashsale serve: {problem}", err=True)
        sys.exit(EXIT_NO_SHARD)


def parse_partitions(text: str | None, amqp: AMQPSettings) -> list[int] | None:
    """``consume --partitions`` ("0,2"): the partitions named, sorted, each once; None (every
    partition) when not given.

    Raises:
        click.BadParameter: not comma-separated integers, or one is not a partition of ``amqp``.
    """
    if text is None:
        return None
    try:
        named = [int(part) for part in text.split(",") if part.strip()]
        if not named:
            raise ValueError("no partition named")
        return amqp.chosen_partitions(named)
    except ValueError as exc:
        raise click.BadParameter(f"{text!r}: {exc}", param_hint="--partitions") from None


@click.command()
@click.option(
    "--prefetch",
    default=None,
    type=click.IntRange(1, 10_000),
    help="Unacked messages in hand (default from settings, else 512 orders' worth of messages).",
)
@click.option(
    "--partitions",
    "partitions_text",
    default=None,
    metavar="I,J,...",
    help="Only these order-queue partitions (0-based, comma-separated; default: every partition of "
    "FLASHSALE_AMQP__PARTITIONS).",
)
@metrics_port_option
def consume(prefetch: int | None, partitions_text: str | None, metrics_port: int | None) -> None:
    """Write queued orders to MySQL (run as many as you like). Waits (with back-off, one log line)
    for Redis, RabbitMQ and MySQL when one is away at start. Exits 0 on SIGTERM after finishing
    its messages."""
    from consumers.consume import run_consumer
    from service.bootstrap import open_consumer
    from service.log_setup import configure_logging
    from service.startup import opened_when_reachable

    settings = load_settings()
    partitions = parse_partitions(partitions_text, settings.amqp)
    configure_logging(settings.log_level)

    async def go() -> None:
        # every store asked first, RabbitMQ included: the consumer connects to it itself
        async with opened_when_reachable(settings, open_consumer, check=True) as resources:
            if resources is not None:
                await run_consumer(resources, prefetch, metrics_port, partitions)

    run(go())


@click.command()
@click.option("--product", "product_id", type=int, default=None, help="Only this product.")
@click.option("--dry-run", is_flag=True, help="Report without writing.")
@click.option("--watch", type=float, default=None, metavar="SECONDS", help="Repeat every SECONDS.")
@click.option("--json", "as_json", is_flag=True, help="One JSON array per pass.")
@metrics_port_option
def realign(
    product_id: int | None, dry_run: bool, watch: float | None, as_json: bool, metrics_port: int | None
) -> None:
    """Make Redis stock = MySQL stock - reservations in flight (one pass, or --watch: started
    while a store is away it waits for it; a pass that meets an outage is tried again with
    back-off, one log line when the outage begins and one when it ends)."""
    from consumers.realign import run_realign

    sys.exit(run(run_realign(load_settings(), product_id, dry_run, watch, as_json, metrics_port)))


@click.command()
@click.option("--product", "product_id", type=click.IntRange(1), default=None, help="Only this product.")
@click.option("--watch", type=float, default=None, metavar="SECONDS", help="Repeat every SECONDS.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per pass.")
@metrics_port_option
def sweep(product_id: int | None, watch: float | None, as_json: bool, metrics_port: int | None) -> None:
    """Cancel orders unpaid after the payment window (FLASHSALE_PAYMENT__WINDOW_SECONDS); units go
    back on sale. With --watch it waits out store outages as realign --watch does."""
    from consumers.sweep import run_sweep

    run(run_sweep(load_settings(), product_id, watch, as_json, metrics_port))
