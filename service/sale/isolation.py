"""Run-scoped settings: one database, key prefix and set of queue names per run (tests, ``flashsale sale``)."""

from __future__ import annotations

import json
import re
import secrets
import socket

import aio_pika
from redis.asyncio import Redis
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine

from service.settings import Settings


def new_run_id(kind: str) -> str:
    """``<kind>_<8 hex>``: a name usable as database name, key prefix and queue-name prefix."""
    return f"{kind}_{secrets.token_hex(4)}"


def isolated_settings(base: Settings, run_id: str) -> Settings:
    """``base`` with its own database (named ``run_id``), Redis key prefix and AMQP names.

    Raises:
        ValueError: ``run_id`` is not ``[A-Za-z0-9_]+``.
    """
    if not re.fullmatch(r"[A-Za-z0-9_]+", run_id):
        raise ValueError("run id must match [A-Za-z0-9_]+")
    url = make_url(base.db.url).set(database=run_id).render_as_string(hide_password=False)
    return base.model_copy(
        update={
            "db": base.db.model_copy(update={"url": url}),
            "redis": base.redis.model_copy(update={"key_prefix": run_id}),
            "amqp": base.amqp.model_copy(
                update={
                    "exchange": f"{run_id}.orders",
                    "queue": f"{run_id}.orders",
                    "dead_letter_exchange": f"{run_id}.orders.dlx",
                    "dead_letter_queue": f"{run_id}.orders.dead",
                }
            ),
        }
    )


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (for a subprocess to bind)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def environment(settings: Settings) -> dict[str, str]:
    """The ``FLASHSALE_*`` variables that make a subprocess use ``settings``' isolation."""
    return {
        "FLASHSALE_DB__URL": settings.db.url,
        "FLASHSALE_REDIS__URL": settings.redis.url,
        "FLASHSALE_REDIS__KEY_PREFIX": settings.redis.key_prefix,
        "FLASHSALE_AMQP__URL": settings.amqp.url,
        "FLASHSALE_AMQP__EXCHANGE": settings.amqp.exchange,
        "FLASHSALE_AMQP__QUEUE": settings.amqp.queue,
        "FLASHSALE_AMQP__DEAD_LETTER_EXCHANGE": settings.amqp.dead_letter_exchange,
        "FLASHSALE_AMQP__DEAD_LETTER_QUEUE": settings.amqp.dead_letter_queue,
        "FLASHSALE_AMQP__DELIVERY_LIMIT": str(settings.amqp.delivery_limit),
        "FLASHSALE_AUTH__JWT_SECRET": settings.auth.jwt_secret,
        "FLASHSALE_REALIGN__GRACE_SECONDS": str(settings.realign.grace_seconds),
        "FLASHSALE_PAYMENT__WINDOW_SECONDS": str(settings.payment.window_seconds),
        "FLASHSALE_PAYMENT__CHANNEL_SECRETS": json.dumps(settings.payment.channel_secrets),
        "FLASHSALE_PAYMENT__CURRENCY": settings.payment.currency,
        "FLASHSALE_BENCH_ROUTES": "true" if settings.bench_routes else "false",
    }


async def tear_down(settings: Settings) -> None:
    """Drop the run's database, unlink its Redis keys, delete its queues and exchanges."""
    parsed = make_url(settings.db.url)
    engine = create_async_engine(parsed._replace(database=None))
    try:
        async with engine.begin() as conn:
            await conn.execute(text(f"DROP DATABASE IF EXISTS `{parsed.database}`"))
    finally:
        await engine.dispose()

    redis = Redis.from_url(settings.redis.url)
    try:
        batch = []
        # The prefix and anything derived from it (tests use "<prefix>-<part>" prefixes too).
        async for key in redis.scan_iter(match=f"{settings.redis.key_prefix}*", count=1000):
            batch.append(key)
            if len(batch) >= 1000:
                await redis.unlink(*batch)
                batch.clear()
        if batch:
            await redis.unlink(*batch)
    finally:
        await redis.aclose()

    amqp = settings.amqp
    connection = await aio_pika.connect(amqp.url)
    try:
        channel = await connection.channel()
        for queue in (amqp.queue, amqp.dead_letter_queue):
            await channel.queue_delete(queue)
        for exchange in (amqp.exchange, amqp.dead_letter_exchange):
            await channel.exchange_delete(exchange)
    finally:
        await connection.close()
