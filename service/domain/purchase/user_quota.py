"""The per-user limit as MySQL keeps it: one rule for both stock modes.

Redis checks the limit first (``lua/reserve.lua``, the user's quota hash), but Redis can forget a
quota (eviction, a failover to a replica that had not got it, FLUSHALL): the buyer then passes
Redis again. So the transaction that writes an order that takes stock also counts its units in
``user_quota`` (per product and user) and refuses the order when the count would pass
``products.per_user_limit``:

- the consumer's batch (:mod:`service.domain.fulfilment.order_writer`): the extra order is written
  ``rejected``/``limit_exceeded`` (its buyer reads it at ``GET /orders/{order_no}``), takes no
  stock, and realignment gives its Redis reservation back as for every rejected order;
- the ``database``-mode purchase (:mod:`service.domain.purchase.database`): ``409
  limit_exceeded``, the transaction rolls back.

What counts is what realignment counts (``UNITS_HELD``): every order but ``cancelled`` and
``rejected`` ones. A cancel (buyer or payment timeout) gives the units back
(:func:`service.domain.orders.lifecycle.return_stock`); a refund does not (the buyer did buy).

Lock order: every caller holds the product's inventory row lock before it touches the product's
quota rows (see :mod:`db.queries.quota`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncConnection

from db.engine import DriverStatement, on_driver
from db.queries import quota
from db.queries.json_rows import json_rows

_ADD_MANY = DriverStatement(quota.ADD_MANY)
_OVER_LIMIT = DriverStatement(quota.OVER_LIMIT)


@dataclass(frozen=True, slots=True)
class OverLimit:
    """A user whose count passed the limit: ``bought`` units counted now (this transaction's
    additions included), ``limit`` the product's per-user limit."""

    bought: int
    limit: int


async def add_units(conn: AsyncConnection, product_id: int, units: Mapping[str, int]) -> dict[str, OverLimit]:
    """Count ``units`` (user -> units) against product ``product_id``'s limit inside the caller's
    transaction (which holds the inventory row lock); returns the users now over the limit (their
    rows stay locked: the caller takes back what it does not keep, :func:`take_back`, or rolls
    back). Two statements: one multi-row upsert, one read of those over the limit."""
    if not units:
        return {}
    payload = json_rows(sorted(units.items()))  # [user, units] pairs, in user order
    await on_driver(conn, _ADD_MANY, {"p": product_id, "rows": payload})
    _, over = await on_driver(conn, _OVER_LIMIT, {"p": product_id, "rows": payload})
    return {user_id: OverLimit(int(bought), int(limit)) for user_id, bought, limit in over}


async def take_back(conn: AsyncConnection, product_id: int, units: Mapping[str, int]) -> None:
    """Units (user -> units) no longer held against product ``product_id``'s limit: a cancel, or
    units :func:`add_units` counted for orders the transaction then did not take."""
    for user_id, count in sorted(units.items()):
        if count:
            await conn.execute(quota.TAKE_BACK, {"p": product_id, "u": user_id, "units": count})


async def bought(conn: AsyncConnection, product_id: int, user_id: str) -> int:
    """Units ``user_id`` holds of ``product_id`` as MySQL counts them (0 when none)."""
    return int((await conn.execute(quota.BOUGHT, {"p": product_id, "u": user_id})).scalar() or 0)
