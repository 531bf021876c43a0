"""Statements on ``inventory``: the authoritative stock (``stock + sold`` constant except when
stock is added or returned; ``version`` goes up with every change)."""

from __future__ import annotations

from sqlalchemy import text

TAKE = text(
    "UPDATE inventory SET stock = stock - :quantity, sold = sold + :quantity, version = version + 1"
    " WHERE product_id = :product_id AND stock >= :quantity"
)
"""The conditional decrement: matches no row when fewer than ``:quantity`` units are left
(MySQL dialects report matched rows, so rowcount 1 means the units were taken)."""

STOCK_LOCKED = text("SELECT stock FROM inventory WHERE product_id = :p FOR UPDATE")
"""Units left of product ``:p``, the row locked until the transaction ends (decide which of many
orders fit, then :data:`TAKE` exactly those)."""

GIVE_BACK = text(
    "UPDATE inventory SET stock = stock + :q, sold = sold - :q, version = version + 1 WHERE product_id = :p"
)
"""Returned units (cancel, payment timeout, refund with restock) go back on sale."""

VERSION = text(
    "SELECT i.version, p.buckets FROM inventory i JOIN products p ON p.id = i.product_id WHERE i.product_id = :p"
)
"""Product ``:p``'s inventory version and stock buckets (where returned units go in Redis)."""

SET_SALE_UNITS = text(
    "INSERT INTO inventory (product_id, stock, sold, version) VALUES (:id, :stock, 0, 0)"
    " ON DUPLICATE KEY UPDATE stock = GREATEST(VALUES(stock) - sold, 0), version = version + 1"
)
"""``:stock`` is the sale's units in all, sold ones included: MySQL keeps ``stock - sold``."""

PRODUCT_IDS = text("SELECT product_id FROM inventory ORDER BY product_id")

SNAPSHOT = text(
    "SELECT i.stock, i.sold, i.version, p.per_user_limit, p.price, p.sale_starts_at, p.sale_ends_at,"
    " p.stock_mode, p.require_token, p.buckets, p.waiting_room"
    " FROM inventory i JOIN products p ON p.id = i.product_id WHERE i.product_id = :p"
)
"""What realignment reads of product ``:p`` in its consistent snapshot."""

STOCK = text("SELECT stock FROM inventory WHERE product_id = :p")
STOCK_AND_SOLD = text("SELECT stock, sold FROM inventory WHERE product_id = :p")
