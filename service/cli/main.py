"""The ``flashsale`` console script: serve, consume, realign, sale, bench, migrate, product, token, pay, sweep."""

from __future__ import annotations

import json
import sys
from collections.abc import Coroutine
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import click
import msgspec

from service.cli.dlq import dlq
from service.runtime import run_async
from service.settings import AMQPSettings, get_settings

T = TypeVar("T")


def _run(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on uvloop (the asyncio loop where uvloop is missing)."""
    return run_async(coro)


class FlashsaleGroup(click.Group):
    """The ``flashsale`` group: a configuration error (an invalid setting, a store its URL does
    not reach, a development secret outside development mode) ends the command with one line on
    stderr naming the variable, exit code 2; a use case's refusal (:class:`DomainError`, e.g. a
    product whose realignment lock another pass holds) with one line, exit code 1; ``--debug``
    shows the traceback instead."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except Exception as exc:
            if ctx.meta.get("flashsale.debug"):
                raise
            problem = _config_problem(exc)
            if problem is None:
                from service.domain.errors import DomainError

                if isinstance(exc, DomainError):  # e.g. a product another realignment pass holds
                    click.echo(f"flashsale: {exc}", err=True)
                    ctx.exit(1)
                raise
            click.echo(f"flashsale: configuration error: {problem}", err=True)
            ctx.exit(2)


def _config_problem(exc: Exception) -> str | None:
    from service.settings import ConfigError

    if isinstance(exc, ConfigError):
        return str(exc)
    try:
        settings = get_settings()
    except ConfigError:
        return None
    from service.startup import unreachable

    problem = unreachable(exc, settings)
    return None if problem is None else str(problem)


@click.group(cls=FlashsaleGroup)
@click.version_option(package_name="flashsale", message="flashsale %(version)s")
@click.option("--debug", is_flag=True, help="Show tracebacks instead of one-line configuration errors.")
@click.pass_context
def main(ctx: click.Context, debug: bool) -> None:
    """flashsale: inventory-aware order service for flash sales."""
    ctx.meta["flashsale.debug"] = debug


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535), help="TCP port.")
@click.option("--workers", default=2, show_default=True, type=click.IntRange(1, 64), help="granian worker processes.")
def serve(host: str, port: int, workers: int) -> None:
    """Run the purchase API (granian, WORKERS processes). Asks Redis, RabbitMQ and MySQL once
    first: a store that refuses as configured (wrong credentials, unknown database) ends it with
    one line and exit code 2; a store that does not answer (down, restarting) is named in one
    line and the API starts all the same: /api/v1/health/ready answers 503 and purchases
    503 unavailable until each worker has connected (it keeps trying with back-off). Fewer free
    order-number shards than WORKERS (at most 90 worker processes per key prefix), before or
    while the workers start, ends it with one line and exit code 3."""
    from service.cli.serve import metrics_directory, serve_app, shards_short

    settings = get_settings()
    settings.require_secrets()
    # The multiprocess directory first: the check imports prometheus_client, which reads it once.
    with metrics_directory(settings.metrics.enabled):
        from service.startup import report_dependencies

        for away in _run(report_dependencies(settings)):
            click.echo(f"flashsale: {away}; starting anyway, not ready until it answers", err=True)
        problem = _run(shards_short(settings, workers)) or serve_app("service.api.app:create_app", host, port, workers)
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


_metrics_port = click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    default=None,
    help="Serve /metrics on this port (default FLASHSALE_METRICS__PORT; 0: not served).",
)


@main.command()
@click.option(
    "--prefetch", default=None, type=click.IntRange(1, 10_000), help="Unacked messages in hand (default from settings)."
)
@click.option(
    "--partitions",
    "partitions_text",
    default=None,
    metavar="I,J,...",
    help="Only these order-queue partitions (0-based, comma-separated; default: every partition of "
    "FLASHSALE_AMQP__PARTITIONS).",
)
@_metrics_port
def consume(prefetch: int | None, partitions_text: str | None, metrics_port: int | None) -> None:
    """Write queued orders to MySQL (run as many as you like). Waits (with back-off, one log line)
    for Redis, RabbitMQ and MySQL when one is away at start. Exits 0 on SIGTERM after finishing
    its messages."""
    from consumers.order_consumer import run_consumer
    from service.log_setup import configure_logging
    from service.startup import opened_when_reachable

    settings = get_settings()
    partitions = parse_partitions(partitions_text, settings.amqp)
    configure_logging(settings.log_level)

    async def go() -> None:
        # every store asked first, RabbitMQ included: the consumer connects to it itself
        async with opened_when_reachable(settings, publish=False, check=True) as resources:
            if resources is not None:
                await run_consumer(resources, prefetch or settings.amqp.prefetch, metrics_port, partitions)

    _run(go())


@main.command()
@click.option("--product", "product_id", type=int, default=None, help="Only this product.")
@click.option("--dry-run", is_flag=True, help="Report without writing.")
@click.option("--watch", type=float, default=None, metavar="SECONDS", help="Repeat every SECONDS.")
@click.option("--json", "as_json", is_flag=True, help="One JSON array per pass.")
@_metrics_port
def realign(
    product_id: int | None, dry_run: bool, watch: float | None, as_json: bool, metrics_port: int | None
) -> None:
    """Make Redis stock = MySQL stock - reservations in flight (one pass, or --watch: started
    while a store is away it waits for it; a pass that meets an outage is tried again with
    back-off, one log line when the outage begins and one when it ends)."""
    from consumers.realign import run_realign

    sys.exit(_run(run_realign(get_settings(), product_id, dry_run, watch, as_json, metrics_port)))


@main.command()
@click.option("--stock", default=1000, show_default=True, type=click.IntRange(1), help="Units on sale.")
@click.option(
    "--requests", "requests_", default=50_000, show_default=True, type=click.IntRange(1), help="Purchase requests."
)
@click.option("--users", default=20_000, show_default=True, type=click.IntRange(1), help="Distinct buyers (JWTs).")
@click.option(
    "--concurrency", default=256, show_default=True, type=click.IntRange(1), help="Requests in flight at once."
)
@click.option("--limit", "per_user_limit", default=2, show_default=True, type=click.IntRange(1), help="Per-user limit.")
@click.option("--workers", default=2, show_default=True, type=click.IntRange(1), help="API workers to start.")
@click.option("--consumers", default=2, show_default=True, type=click.IntRange(1), help="Consumer processes to start.")
@click.option(
    "--buckets",
    default=1,
    show_default=True,
    type=click.IntRange(1, 64),
    help="Redis stock buckets of the sale's product (a product hotter than one Redis Cluster slot).",
)
@click.option(
    "--partitions",
    default=None,
    type=click.IntRange(1, 64),
    help="Order-queue partitions of the run (default FLASHSALE_AMQP__PARTITIONS; with --url, the running API's); "
    "consumer i takes partitions j with j mod consumers = i (with more consumers than partitions, partition "
    "i mod N), so every partition has a consumer.",
)
@click.option("--url", default=None, help="Target a running API instead of starting one (admin token from settings).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option(
    "--noop-requests",
    default=10_000,
    show_default=True,
    type=click.IntRange(0),
    help="Requests to the no-op route before the load: the ceiling of the sale's own client (0: none).",
)
@click.option(
    "--pay-share",
    default=0.0,
    show_default=True,
    type=click.FloatRange(0, 1),
    help="Share of the orders to pay after the drain; the rest time out, are swept and resold (0: off).",
)
@click.option(
    "--payment-window",
    default=5,
    show_default=True,
    type=click.IntRange(1),
    metavar="SECONDS",
    help="Payment window of the run's API and sweep, with --pay-share.",
)
@click.option(
    "--publish-mode",
    type=click.Choice(["confirm", "async"]),
    default=None,
    help="FLASHSALE_ORDERS__PUBLISH_MODE of the API processes it starts (default: from settings).",
)
@click.option(
    "--report",
    "report_dir",
    default=None,
    type=click.Path(file_okay=False, path_type=Path),
    help="Also write an HTML report with charts (report.html and PNGs) to DIR.",
)
@click.option(
    "--redis-cluster",
    "cluster_node",
    default=None,
    metavar="URL",
    help="Run on the running Redis Cluster that has this node (redis://HOST:PORT): "
    "FLASHSALE_REDIS__URL=URL and FLASHSALE_REDIS__CLUSTER=true for every process of the sale.",
)
def sale(cluster_node: str | None, **options: Any) -> None:
    """Run a whole flash sale end to end on the real services and check every invariant."""
    from service.sale.job import run_sale

    settings = get_settings()
    if cluster_node is not None:
        redis = settings.redis.model_copy(update={"url": cluster_node, "cluster": True})
        settings = settings.model_copy(update={"redis": redis})
    sys.exit(_run(run_sale(settings, **options)))


def _bench_rows(ctx: click.Context, param: click.Parameter, value: str) -> tuple[str, ...]:
    """``--only``: comma-separated row keys of ``flashsale bench``, each a known one."""
    from service.bench.rows import all_row_keys

    keys = tuple(key.strip() for key in value.split(",") if key.strip())
    unknown = [key for key in keys if key not in all_row_keys()]
    if unknown:
        raise click.BadParameter(f"unknown row {', '.join(unknown)}; rows: {', '.join(all_row_keys())}")
    return keys


@main.command()
@click.option(
    "--duration",
    default=8,
    show_default=True,
    type=click.IntRange(1, 600),
    metavar="SECONDS",
    help="Measured load per HTTP row and round (whole seconds).",
)
@click.option("--connections", default=64, show_default=True, type=click.IntRange(1, 10_000), help="wrk connections.")
@click.option("--threads", default=1, show_default=True, type=click.IntRange(1, 64), help="wrk threads.")
@click.option(
    "--workers", default=1, show_default=True, type=click.IntRange(1, 64), help="granian workers of every server."
)
@click.option(
    "--backlog",
    default=20_000,
    show_default=True,
    type=click.IntRange(1, 1_000_000),
    help="Orders for the consumer and raw-writer rows.",
)
@click.option(
    "--consumers",
    default=2,
    show_default=True,
    type=click.IntRange(1, 16),
    help="flashsale consume processes draining the backlog together.",
)
@click.option(
    "--batch",
    default=100,
    show_default=True,
    type=click.IntRange(2, 1000),
    help="Orders per transaction of the batched raw writer.",
)
@click.option(
    "--rounds",
    default=1,
    show_default=True,
    type=click.IntRange(1, 20),
    help="Measure every row this many times, interleaved.",
)
@click.option(
    "--profile",
    "profile_dir",
    default=None,
    type=click.Path(file_okay=False, path_type=Path),
    help="Run py-spy on the server under each HTTP row; stacks and summaries in DIR.",
)
@click.option(
    "--only",
    default="",
    metavar="ROWS",
    callback=_bench_rows,
    help="Measure only these rows (comma-separated keys, e.g. product_noop_paired,product_noop_metrics_off; "
    "the drain rows run together when one is named). Default: every row.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def bench(as_json: bool, **options) -> None:  # type: ignore[no-untyped-def]
    """Measure each hop (bare framework, no-op, sold out, accept, consumer, raw MySQL writers)
    side by side in one isolated run, with wrk as the load client. Exit 0 when every row was
    measured (targets are reported, not enforced), 2 when it could not run."""
    from service.bench.context import Options
    from service.bench.run import run_bench

    sys.exit(_run(run_bench(get_settings(), Options(**options), as_json)))


@main.command()
@click.argument("order_no")
@click.option("--amount", type=click.IntRange(0), default=None, help="Minor units (default: the order's amount).")
@click.option("--txn", "txn_id", default=None, help="The channel's transaction id (default: a new one).")
@click.option(
    "--event",
    type=click.Choice(["paid", "refunded", "refund_failed", "refund_rejected"]),
    default="paid",
    show_default=True,
    help="What happened.",
)
@click.option("--channel", default=None, help="Channel name (default: the first configured).")
@click.option("--currency", default=None, help="ISO 4217 (default: the shop's).")
@click.option("--url", default="http://127.0.0.1:8000", show_default=True, help="The API.")
@click.option("--json", "as_json", is_flag=True, help='Print {"status", "answer"} as one JSON object.')
def pay(
    order_no: str,
    amount: int | None,
    txn_id: str | None,
    event: str,
    channel: str | None,
    currency: str | None,
    url: str,
    as_json: bool,
) -> None:
    """Send a signed payment notification for ORDER_NO, as a payment channel would."""
    from service.cli.pay import send_notification

    settings = get_settings()
    settings.require_secrets()
    response = _run(send_notification(settings, order_no, amount, txn_id, event, channel, currency, url))
    if as_json:
        click.echo(json.dumps({"status": response.status_code, "answer": response.json()}))
    else:
        click.echo(f"{response.status_code} {response.text}")


@main.command()
@click.option("--product", "product_id", type=click.IntRange(1), default=None, help="Only this product.")
@click.option("--watch", type=float, default=None, metavar="SECONDS", help="Repeat every SECONDS.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per pass.")
@_metrics_port
def sweep(product_id: int | None, watch: float | None, as_json: bool, metrics_port: int | None) -> None:
    """Cancel orders unpaid after the payment window (FLASHSALE_PAYMENT__WINDOW_SECONDS); units go
    back on sale. With --watch it waits out store outages as realign --watch does."""
    from service.cli.pay import run_sweep

    _run(run_sweep(get_settings(), product_id, watch, as_json, metrics_port))


@main.group()
def channel() -> None:
    """The payment channel simulator (an outside party: two channels, mockpay and altpay)."""


@channel.command("serve")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--port", default=8100, show_default=True, type=click.IntRange(1, 65535), help="Port of the simulated channels."
)
def channel_serve(host: str, port: int) -> None:
    """Serve the simulated channels over HTTP (one process: the books live in memory)."""
    from service.cli.serve import serve_app

    serve_app("service.channel.app:create_channel_app", host, port, 1)


@channel.command("pay")
@click.argument("order_no")
@click.option("--channel", "channel_name", default="mockpay", show_default=True, help="The channel to pay at.")
@click.option("--url", default=None, help="The channel's base URL (default: FLASHSALE_PAYMENT__CHANNEL_URLS).")
def channel_pay(order_no: str, channel_name: str, url: str | None) -> None:
    """The buyer pays ORDER_NO at a running simulator (after POST /api/v1/orders/{order_no}/pay)."""
    import httpx

    base = url or get_settings().payment.channel_urls.get(channel_name)
    if base is None:
        raise click.BadParameter(f"no URL for channel {channel_name}")
    response = httpx.post(f"{base}/payments/{order_no}/pay", timeout=10)
    click.echo(f"{response.status_code} {response.text}")
    if not response.is_success:
        sys.exit(1)


@main.group()
def payments() -> None:
    """Payments at the channels."""


@payments.command("sync")
@click.argument("order_no")
def payments_sync(order_no: str) -> None:
    """Ask ORDER_NO's channels about its payment; one paid there is applied (as its notification
    would be). One JSON line per channel asked; exit 1 when a channel did not answer."""
    from service.cli.pay import run_sync
    from service.domain.errors import InvalidInput

    try:
        states = _run(run_sync(get_settings(), order_no))
    except InvalidInput as exc:
        raise click.BadParameter(exc.detail) from None
    for state in states:
        click.echo(msgspec.json.encode(state).decode())
    if any(state["status"] == "unavailable" for state in states):
        sys.exit(1)


@main.command()
@click.option("--date", "day", required=True, type=click.DateTime(["%Y-%m-%d"]), help="The UTC day (YYYY-MM-DD).")
@click.option("--channel", "channel_name", default=None, help="Only this channel (default: every channel with a URL).")
@click.option("--apply", "apply_fixes", is_flag=True, help="Apply the safe fixes (payments missing here).")
@click.option("--json", "as_json", is_flag=True, help="One JSON document.")
def reconcile(day: datetime, channel_name: str | None, apply_fixes: bool, as_json: bool) -> None:
    """Compare the channels' bills of DATE with the payments table: missing here, missing at the
    channel, amount mismatch, owed back. Exit 0 when clean (after --apply), 1 otherwise."""
    from service.cli.reconcile import print_reconciliation, run_reconcile
    from service.domain.errors import InvalidInput

    try:
        report = _run(run_reconcile(get_settings(), day.date(), channel_name, apply_fixes))
    except InvalidInput as exc:
        raise click.BadParameter(exc.detail) from None
    print_reconciliation(report, as_json)
    sys.exit(0 if report.clean else 1)


@main.command()
@click.option("--current", "show_current", is_flag=True, help="Print the current revision and change nothing.")
@click.option("--downgrade", "down_to", default=None, metavar="REV", help="Downgrade to REV (base, -1, 0001...).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as one JSON object.")
def migrate(show_current: bool, down_to: str | None, as_json: bool) -> None:
    """Create the database if missing and upgrade the schema to head (Alembic); or show the
    current revision, or downgrade to one."""
    from alembic.util.exc import CommandError

    from db import migrate as migrations

    url = get_settings().db.url
    database = url.split("@")[-1]
    try:
        if show_current:
            action, revision = "current", _run(migrations.current(url))
        elif down_to is not None:
            action, revision = "downgraded", _run(migrations.downgrade(url, down_to))
        else:
            action, revision = "migrated", _run(migrations.upgrade(url))
    except CommandError as exc:
        raise click.BadParameter(str(exc), param_hint="--downgrade") from None
    if as_json:
        click.echo(json.dumps({"action": action, "database": database, "revision": revision}))
    else:
        click.echo(f"{action} {database}: revision {revision or 'none'}")


@main.group()
def product() -> None:
    """Products and their stock."""


@product.command("set")
@click.argument("product_id", type=click.IntRange(1))
@click.option("--stock", required=True, type=click.IntRange(0), help="The sale's units in all, sold ones included.")
@click.option(
    "--price", default=None, type=click.IntRange(0), help="Minor currency units (kept when left out; 0 on creation)."
)
@click.option(
    "--limit",
    "per_user_limit",
    default=None,
    type=click.IntRange(1),
    help="Per-user limit in units (kept when left out; 1 on creation).",
)
@click.option("--name", default=None, help="Kept when left out.")
@click.option(
    "--starts",
    type=click.DateTime(["%Y-%m-%dT%H:%M:%S", "%Y-%m-%dT%H:%M:%S%z", "%Y-%m-%d"]),
    default=None,
    help="Sale opens (ISO 8601, naive = UTC; on creation default: now; on update kept).",
)
@click.option(
    "--ends",
    type=click.DateTime(["%Y-%m-%dT%H:%M:%S", "%Y-%m-%dT%H:%M:%S%z", "%Y-%m-%d"]),
    default=None,
    help="Sale ends (ISO 8601, naive = UTC; on creation default: no end; on update kept).",
)
@click.option(
    "--stock-mode",
    type=click.Choice(["database", "redis"]),
    default=None,
    help="database: a MySQL transaction per purchase (201); redis: Redis pre-decrement and the queue (202). "
    "Kept when left out (database on creation); a change switches safely mid-sale.",
)
@click.option(
    "--require-token/--no-require-token",
    default=None,
    help="A purchase needs an Order-Token from POST /api/v1/orders/tokens (kept when left out; off on creation).",
)
@click.option(
    "--buckets",
    type=click.IntRange(1, 64),
    default=None,
    help="Redis stock buckets: the stock split over K hash tags, for a product hotter than one Redis Cluster "
    "slot (on creation only, default 1; fixed from then on).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the load report as JSON.")
def product_set(
    product_id: int,
    stock: int,
    price: int | None,
    per_user_limit: int | None,
    name: str | None,
    starts: datetime | None,
    ends: datetime | None,
    stock_mode: str | None,
    require_token: bool | None,
    buckets: int | None,
    as_json: bool,
) -> None:
    """Create or update PRODUCT_ID: STOCK is the sale's units in all (sold ones included), and
    Redis is loaded safely (never over live stock). With Redis down, --stock-mode database is
    written on MySQL alone (the rollback plan; the Redis load waits for the next realignment)."""
    from db.models import StockMode
    from service.bootstrap import opened
    from service.cli.render import print_reports
    from service.cli.without_redis import redis_answers, set_product_without_redis
    from service.domain.stock.catalog import InvalidProduct, ProductInput
    from service.domain.stock.realign import RealignReport
    from service.log_setup import configure_logging

    async def load(data: ProductInput) -> RealignReport:
        configure_logging("WARNING")
        settings = get_settings()
        if data.stock_mode is StockMode.DATABASE and not await redis_answers(settings):
            # The rollback plan: Redis is lost, the product sells from MySQL alone.
            return await set_product_without_redis(settings, product_id, data)
        async with opened(settings) as resources:
            return await resources.catalog.set(product_id, data)

    fields = {
        "stock": stock,
        "price": price,
        "per_user_limit": per_user_limit,
        "name": name,
        "sale_starts_at": starts,
        "sale_ends_at": ends,
        "stock_mode": stock_mode,
        "require_token": require_token,
        "buckets": buckets,
    }
    try:
        data = msgspec.convert({k: v for k, v in fields.items() if v is not None}, ProductInput)
        report = _run(load(data))
    except (msgspec.ValidationError, InvalidProduct) as exc:
        raise click.BadParameter(str(exc)) from None
    print_reports([report], as_json)


@main.command()
@click.option("--user", "user_id", required=True, help="The user id (JWT sub): 1-64 of A-Za-z0-9_.:@-.")
@click.option("--admin", is_flag=True, help="Add role: admin (admin routes).")
@click.option("--ttl", default=None, type=click.IntRange(1), help="Seconds (default from settings).")
def token(user_id: str, admin: bool, ttl: int | None) -> None:
    """Print a JWT for USER (HS256 with FLASHSALE_AUTH__JWT_SECRET)."""
    from service.api.auth import issue_token

    settings = get_settings()
    settings.require_secrets()
    try:
        auth = settings.auth
        ttl_seconds = ttl or auth.token_ttl_seconds
        click.echo(
            issue_token(
                auth.jwt_secret, user_id, admin, ttl_seconds, audience=auth.audience or None, issuer=auth.issuer or None
            )
        )
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--user") from None


main.add_command(dlq)

if __name__ == "__main__":
    main()
