"""The record of a pre-queue's draw: written to MySQL (``waiting_room_draws``) and logged by the
API process whose call opened the room, read back by ``flashsale product draw`` (docs/CLI.md)."""

from __future__ import annotations

import hashlib

import structlog
from sqlalchemy.ext.asyncio import AsyncEngine

from db.queries import draws
from service.adapters.redis.waiting_room import WaitingRooms
from service.model.waiting_room import Draw

log = structlog.get_logger(__name__)


async def record_draw(engine: AsyncEngine, rooms: WaitingRooms, product_id: int) -> Draw | None:
    """Read the product's draw from Redis and record it (once per opening; a repeat is a no-op):
    a ``waiting_room_draws`` row and one log line with the seed, the entrants and the SHA-256 of
    the drawn order. None before the opening.

    Raises:
        service.failures.StoreUnavailable: Redis or MySQL failed.
    """
    draw = await rooms.draw(product_id)
    if draw is None:
        return None
    order = "\n".join(draw.order)
    async with engine.begin() as conn:
        await conn.execute(
            draws.RECORD,
            {
                "product_id": product_id,
                "opened_ms": draw.opened_ms,
                "seed": draw.seed,
                "entrants": len(draw.order),
                "drawn_order": order,
            },
        )
    log.info(
        "waiting_room_drawn",
        product_id=product_id,
        opened_ms=draw.opened_ms,
        seed=draw.seed,
        entrants=len(draw.order),
        order_sha256=hashlib.sha256(order.encode()).hexdigest(),
    )
    return draw


async def read_draw(engine: AsyncEngine, rooms: WaitingRooms, product_id: int) -> Draw | None:
    """The product's newest recorded draw; when MySQL has none yet, the one Redis holds (then
    recorded). None when the room has not opened.

    Raises:
        service.failures.StoreUnavailable: MySQL failed, or Redis when MySQL has no record.
    """
    async with engine.connect() as conn:
        row = (await conn.execute(draws.LATEST, {"product_id": product_id})).first()
    if row is None:
        return await record_draw(engine, rooms, product_id)
    order = tuple(row.drawn_order.split("\n")) if row.drawn_order else ()
    return Draw(product_id, int(row.opened_ms), row.seed, order)
