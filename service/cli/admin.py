"""The operator's set-up commands: ``migrate`` (the schema), ``product set`` (a product and its
stock), ``product draw`` (the record of a waiting room's lottery) and ``token`` (a JWT for a user)."""

from __future__ import annotations

import json
from datetime import datetime

import click

from service.cli.common import load_settings, run


@click.command()
@click.option("--current", "show_current", is_flag=True, help="Print the current revision and change nothing.")
@click.option("--downgrade", "down_to", default=None, metavar="REV", help="Downgrade to REV (base, -1, 0001...).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as one JSON object.")
def migrate(show_current: bool, down_to: str | None, as_json: bool) -> None:
    """Create the database if missing and upgrade the schema to head (Alembic); or show the
    current revision, or downgrade to one."""
    from alembic.util.exc import CommandError

    from db import migrate as migrations

    url = load_settings().db.url
    database = url.split("@")[-1]
    try:
        if show_current:
            action, revision = "current", run(migrations.current(url))
        elif down_to is not None:
            action, revision = "downgraded", run(migrations.downgrade(url, down_to))
        else:
            action, revision = "migrated", run(migrations.upgrade(url))
    except CommandError as exc:
        raise click.BadParameter(str(exc), param_hint="--downgrade") from None
    if as_json:
        click.echo(json.dumps({"action": action, "database": database, "revision": revision}))
    else:
        click.echo(f"{action} {database}: revision {revision or 'none'}")


@click.group()
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
@click.option(
    "--waiting-room",
    type=click.Choice(["on", "off"]),
    default=None,
    help="Buyers pass the product's waiting room and a purchase needs their Admission-Token (stock mode redis, "
    "one bucket; kept when left out, off on creation).",
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
    waiting_room: str | None,
    as_json: bool,
) -> None:
    """Create or update PRODUCT_ID: STOCK is the sale's units in all (sold ones included), and
    Redis is loaded safely (never over live stock). With Redis down, --stock-mode database is
    written on MySQL alone (the rollback plan; the Redis load waits for the next realignment)."""
    import msgspec

    from consumers.realign import print_reports
    from db.models import StockMode
    from service.bootstrap import open_job, opened
    from service.cli.product_terms import describe_change, product_terms
    from service.cli.without_redis import redis_answers, set_product_without_redis
    from service.domain.stock.catalog import InvalidProduct, ProductInput
    from service.domain.stock.realign_report import RealignReport
    from service.log_setup import configure_logging

    async def load(data: ProductInput) -> tuple[RealignReport, str]:
        configure_logging("WARNING")
        settings = load_settings()
        before = await product_terms(settings, product_id)
        if data.stock_mode is StockMode.DATABASE and not await redis_answers(settings):
            # The rollback plan: Redis is lost, the product sells from MySQL alone.
            report = await set_product_without_redis(settings, product_id, data)
        else:
            async with opened(open_job(settings)) as job:
                report = await job.catalog.set(product_id, data)
        return report, describe_change(product_id, before, await product_terms(settings, product_id))

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
        "waiting_room": None if waiting_room is None else waiting_room == "on",
    }
    try:
        data = msgspec.convert({k: v for k, v in fields.items() if v is not None}, ProductInput)
        report, change = run(load(data))
    except (msgspec.ValidationError, InvalidProduct) as exc:
        raise click.BadParameter(str(exc)) from None
    if not as_json:
        click.echo(change)
    print_reports([report], as_json)


@product.command("draw")
@click.argument("product_id", type=click.IntRange(1))
@click.option("--json", "as_json", is_flag=True, help="Print the draw as one JSON object, with the whole order.")
def product_draw(product_id: int, as_json: bool) -> None:
    """The draw of PRODUCT_ID's waiting-room pre-queue at the opening of its sale, as recorded
    (MySQL ``waiting_room_draws``; recorded from Redis first if it is not yet): the seed, the
    entrants, the drawn order, and whether the seed reproduces that order. Exit 1 when it does
    not, or before the opening (the seed stays secret until then)."""
    from datetime import UTC

    from service.bootstrap import open_job, opened
    from service.domain.waiting_room.draws import read_draw
    from service.domain.waiting_room.lottery import drawn_order
    from service.log_setup import configure_logging
    from service.model.waiting_room import Draw

    async def read() -> Draw | None:
        configure_logging("WARNING")
        async with opened(open_job(load_settings(), publish=False)) as job:
            return await read_draw(job.engine, job.store.rooms, product_id)

    draw = run(read())
    if draw is None:
        click.echo(f"product {product_id}: its waiting room has not opened (no draw yet)", err=True)
        raise SystemExit(1)
    reproduced = drawn_order(draw.seed, draw.order) == list(draw.order)
    opened_at = datetime.fromtimestamp(draw.opened_ms / 1000, UTC).isoformat(timespec="milliseconds")
    if as_json:
        fields = {"product_id": product_id, "opened_at": opened_at, "opened_ms": draw.opened_ms, "seed": draw.seed}
        click.echo(json.dumps({**fields, "entrants": len(draw.order), "reproduced": reproduced, "order": draw.order}))
    else:
        click.echo(f"product {product_id}: opened {opened_at}, seed {draw.seed or '-'}, {len(draw.order)} entrants")
        click.echo(f"order reproduced from the seed: {'yes' if reproduced else 'NO'}")
        for place, user_id in enumerate(draw.order, start=1):
            click.echo(f"{place:>8}  {user_id}")
    if not reproduced:
        raise SystemExit(1)


@click.command()
@click.option("--user", "user_id", required=True, help="The user id (JWT sub): 1-64 of A-Za-z0-9_.:@-.")
@click.option("--admin", is_flag=True, help="Add role: admin (admin routes).")
@click.option("--ttl", default=None, type=click.IntRange(1), help="Seconds (default from settings).")
def token(user_id: str, admin: bool, ttl: int | None) -> None:
    """Print a JWT for USER (HS256 with FLASHSALE_AUTH__JWT_SECRET)."""
    from service.api.tokens import issue_token

    settings = load_settings()
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
