"""Statements on ``products``: name, price (minor units), per-user limit, sale window."""

from __future__ import annotations

from sqlalchemy import text

UPSERT = text(
    "INSERT INTO products"
    " (id, name, price, per_user_limit, sale_starts_at, sale_ends_at, stock_mode, require_token, buckets,"
    " waiting_room)"
    " VALUES (:id, COALESCE(:name, :default_name), COALESCE(:price, 0), COALESCE(:limit, 1),"
    " COALESCE(:starts, UTC_TIMESTAMP()), :ends, COALESCE(:mode, 'database'), COALESCE(:require_token, 0),"
    " COALESCE(:buckets, 1), COALESCE(:waiting_room, 0))"
    " ON DUPLICATE KEY UPDATE name = COALESCE(:name, name), price = COALESCE(:price, price),"
    " per_user_limit = COALESCE(:limit, per_user_limit),"
    " sale_starts_at = COALESCE(:starts, sale_starts_at),"
    " sale_ends_at = IF(:ends_given, :ends, sale_ends_at),"
    " require_token = COALESCE(:require_token, require_token),"
    " waiting_room = COALESCE(:waiting_room, waiting_room)"
)
"""Create or update product ``:id``; a NULL parameter keeps the stored value, and the sale end
is written only when ``:ends_given``. ``:mode`` is used on creation only (default
``database``): an existing product changes mode through :data:`SET_MODE` (the switch).
``:buckets`` too (default 1): a product's stock buckets are fixed at creation."""

TERMS = text(
    "SELECT price, per_user_limit, sale_starts_at, sale_ends_at, stock_mode, buckets, waiting_room"
    " FROM products WHERE id = :id"
)

BUCKETS = text("SELECT buckets FROM products WHERE id = :id")
"""Product ``:id``'s stock buckets K (fixed at creation)."""

ROUTING = text("SELECT stock_mode, require_token, buckets FROM products WHERE id = :id")
"""How product ``:id`` sells: its stock mode, whether it needs an order token, its stock buckets."""

LOCKED = text("SELECT id FROM products WHERE id = :id FOR UPDATE")
"""Product ``:id``'s row, locked until the transaction ends: what a writer of ``products`` takes
first, before the product's inventory row. Every transaction that writes orders holds the
product row shared before it locks the inventory row (the consumer's ``INSERT ... JOIN
products`` and its foreign key check, then ``UPDATE inventory``; a ``database``-mode purchase's
:data:`PURCHASE_TERMS`): one lock order, products then inventory, so a writer of ``products``
mid-sale waits its turn instead of deadlocking with them."""

PURCHASE_TERMS = text(
    "SELECT price, per_user_limit, stock_mode, require_token,"
    " sale_starts_at <= UTC_TIMESTAMP() AND (sale_ends_at IS NULL OR UTC_TIMESTAMP() < sale_ends_at) AS active"
    " FROM products WHERE id = :id LOCK IN SHARE MODE"
)
"""What a ``database``-mode purchase checks of product ``:id``, with the sale window judged by
MySQL's clock; the row locked shared, before the inventory row (the lock order of
:data:`LOCKED`), so a product set or mode switch commits before or after the purchase reads it."""

SET_MODE = text("UPDATE products SET stock_mode = :mode WHERE id = :id")
"""Switch product ``:id`` to stock mode ``:mode`` (with the product row locked, :data:`LOCKED`:
every ``database``-mode purchase reads the mode under a shared lock on that row)."""

VIEW = text(
    "SELECT p.id, p.name, p.price, p.per_user_limit, p.sale_starts_at, p.sale_ends_at, p.stock_mode,"
    " p.require_token, p.buckets, p.waiting_room, i.stock"
    " FROM products p JOIN inventory i ON i.product_id = p.id WHERE p.id = :id"
)

ALL_TERMS = text(
    "SELECT id, name, price, per_user_limit, sale_starts_at, sale_ends_at, stock_mode, require_token, buckets,"
    " waiting_room FROM products ORDER BY id"
)
"""Every product's terms (name, price, limit, sale window, stock mode, token, buckets, waiting
room), by id."""
