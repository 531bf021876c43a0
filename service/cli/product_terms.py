"""What ``flashsale product set`` created or changed: the product's terms in MySQL before and
after, compared."""

from __future__ import annotations

from typing import Any

from db.engine import make_engine
from db.queries import products
from service.settings import Settings


async def product_terms(settings: Settings, product_id: int) -> dict[str, Any] | None:
    """The product's terms as MySQL holds them (None: no such product), by the words
    :func:`describe_change` prints."""
    engine = make_engine(settings.db.url, pool_size=1, max_overflow=0)
    try:
        async with engine.connect() as conn:
            row = (await conn.execute(products.VIEW, {"id": product_id})).first()
    finally:
        await engine.dispose()
    if row is None:
        return None
    return {
        "name": repr(row.name),
        "units on sale": row.stock,
        "price": row.price,
        "limit": row.per_user_limit,
        "stock mode": str(row.stock_mode),
        "sale from": f"{row.sale_starts_at.isoformat(timespec='seconds')}Z",
        "until": f"{row.sale_ends_at.isoformat(timespec='seconds')}Z" if row.sale_ends_at else "no end",
        "order token": "required" if row.require_token else "not required",
        "buckets": row.buckets,
        "waiting room": "on" if row.waiting_room else "off",
    }


def describe_change(product_id: int, before: dict[str, Any] | None, after: dict[str, Any] | None) -> str:
    """One line: ``product 42 created: ...`` (every term), ``product 42 changed: price 19900 ->
    17900, ...`` (the terms that differ) or ``product 42 unchanged``."""
    if after is None:
        return f"product {product_id}: not found after writing it"
    if before is None:
        return f"product {product_id} created: " + ", ".join(f"{term} {value}" for term, value in after.items())
    changed = [f"{term} {before[term]} -> {value}" for term, value in after.items() if before[term] != value]
    return f"product {product_id} changed: " + ", ".join(changed) if changed else f"product {product_id} unchanged"
