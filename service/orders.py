"""Reading an order back: MySQL when it has the row, else Redis while the order is only queued."""

from __future__ import annotations

from datetime import UTC, datetime

import msgspec
from redis.asyncio import Redis
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from db.models import OrderStatus
from service.keys import order_key


class OrderView(msgspec.Struct):
    """An order as its owner sees it. ``status`` is ``queued`` while only Redis knows the order,
    then the MySQL status label; ``quantity`` in units; ``amount`` in minor currency units
    (None while queued)."""

    order_no: str
    request_id: str
    status: str
    product_id: int
    quantity: int
    amount: int | None = None
    reason: str | None = None
    created_at: datetime | None = None


async def find_order(engine: AsyncEngine, redis: Redis, key_prefix: str, user_id: str, order_no: str) -> OrderView | None:
    """The caller's order ``order_no``, or None when unknown or someone else's."""
    async with engine.connect() as conn:
        row = (
            await conn.execute(
                text(
                    "SELECT order_no, request_id, user_id, product_id, quantity, amount, status, reason, created_at"
                    " FROM orders WHERE order_no = :o"
                ),
                {"o": order_no},
            )
        ).first()
    if row is not None:
        if row.user_id != user_id:
            return None
        return OrderView(
            order_no=row.order_no,
            request_id=row.request_id,
            status=OrderStatus(row.status).label,
            product_id=row.product_id,
            quantity=row.quantity,
            amount=row.amount,
            reason=row.reason,
            created_at=row.created_at.replace(tzinfo=UTC),
        )
    queued = await redis.get(order_key(key_prefix, order_no))
    if queued is None:
        return None
    owner, product_id, request_id, quantity = queued.split("|")
    if owner != user_id:
        return None
    return OrderView(order_no=order_no, request_id=request_id, status="queued", product_id=int(product_id), quantity=int(quantity))
