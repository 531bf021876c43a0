"""Products, their sale windows and stock: create/update (admin) and read (anyone)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

import msgspec
from msgspec import Meta
from redis.asyncio import Redis
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from consumers.realign import Realigner, RealignReport
from service.keys import ProductKeys

PositiveId = Annotated[int, Meta(ge=1, le=2**63 - 1)]


class ProductInput(msgspec.Struct, forbid_unknown_fields=True):
    """Create or update a product. ``price`` in minor currency units; ``stock`` is the remaining
    stock to set in MySQL (units); without ``sale_starts_at`` the sale opens now, without
    ``sale_ends_at`` it has no end (ISO 8601; naive times are UTC)."""

    stock: Annotated[int, Meta(ge=0, le=2**31 - 1)]
    price: Annotated[int, Meta(ge=0, le=2**62)] = 0
    per_user_limit: Annotated[int, Meta(ge=1, le=1_000_000)] = 1
    name: Annotated[str, Meta(max_length=200)] = ""
    sale_starts_at: datetime | None = None
    sale_ends_at: datetime | None = None


class ProductView(msgspec.Struct):
    """Public sale info. ``remaining`` is the stock Redis can still sell (MySQL's when not loaded)."""

    id: int
    name: str
    price: int
    per_user_limit: int
    sale_starts_at: datetime
    sale_ends_at: datetime | None
    sale_active: bool
    remaining: int


def _utc_naive(value: datetime) -> datetime:
    return value.astimezone(UTC).replace(tzinfo=None) if value.tzinfo else value


def _epoch_ms(value: datetime | None) -> int:
    return 0 if value is None else int(value.replace(tzinfo=UTC).timestamp() * 1000)


async def set_product(
    engine: AsyncEngine, redis: Redis, realigner: Realigner, key_prefix: str, product_id: int, data: ProductInput
) -> RealignReport:
    """Upsert the product and its MySQL stock, publish the sale window to Redis, then load Redis
    stock by a realignment pass (exact against reservations in flight; never a blind overwrite).

    Raises:
        ValueError: ``sale_ends_at`` is not after ``sale_starts_at``.
    """
    starts = _utc_naive(data.sale_starts_at) if data.sale_starts_at else datetime.now(UTC).replace(tzinfo=None)
    ends = _utc_naive(data.sale_ends_at) if data.sale_ends_at else None
    if ends is not None and ends <= starts:
        raise ValueError("sale_ends_at must be after sale_starts_at")
    row = {
        "id": product_id,
        "name": data.name or f"product {product_id}",
        "price": data.price,
        "limit": data.per_user_limit,
        "starts": starts,
        "ends": ends,
        "stock": data.stock,
    }
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO products (id, name, price, per_user_limit, sale_starts_at, sale_ends_at)"
                " VALUES (:id, :name, :price, :limit, :starts, :ends)"
                " ON DUPLICATE KEY UPDATE name = VALUES(name), price = VALUES(price),"
                " per_user_limit = VALUES(per_user_limit), sale_starts_at = VALUES(sale_starts_at),"
                " sale_ends_at = VALUES(sale_ends_at)"
            ),
            row,
        )
        await conn.execute(
            text(
                "INSERT INTO inventory (product_id, stock, sold, version) VALUES (:id, :stock, 0, 0)"
                " ON DUPLICATE KEY UPDATE stock = VALUES(stock), version = version + 1"
            ),
            row,
        )
    keys = ProductKeys(key_prefix, product_id)
    await redis.hset(
        keys.sale, mapping={"starts_ms": _epoch_ms(starts), "ends_ms": _epoch_ms(ends), "limit": data.per_user_limit}
    )
    return await realigner.realign(product_id)


async def get_product(engine: AsyncEngine, redis: Redis, key_prefix: str, product_id: int) -> ProductView | None:
    """Sale info and remaining stock, or None for an unknown product."""
    async with engine.connect() as conn:
        row = (
            await conn.execute(
                text(
                    "SELECT p.id, p.name, p.price, p.per_user_limit, p.sale_starts_at, p.sale_ends_at, i.stock"
                    " FROM products p JOIN inventory i ON i.product_id = p.id WHERE p.id = :id"
                ),
                {"id": product_id},
            )
        ).first()
    if row is None:
        return None
    redis_stock = await redis.get(ProductKeys(key_prefix, product_id).stock)
    now = datetime.now(UTC).replace(tzinfo=None)
    return ProductView(
        id=row.id,
        name=row.name,
        price=row.price,
        per_user_limit=row.per_user_limit,
        sale_starts_at=row.sale_starts_at.replace(tzinfo=UTC),
        sale_ends_at=row.sale_ends_at.replace(tzinfo=UTC) if row.sale_ends_at else None,
        sale_active=row.sale_starts_at <= now and (row.sale_ends_at is None or now < row.sale_ends_at),
        remaining=int(redis_stock) if redis_stock is not None else row.stock,
    )


async def product_exists(engine: AsyncEngine, product_id: int) -> bool:
    async with engine.connect() as conn:
        return (await conn.execute(text("SELECT 1 FROM products WHERE id = :id"), {"id": product_id})).first() is not None
