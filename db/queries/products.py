"""Statements on ``products``: name, price (minor units), per-user limit, sale window."""

from __future__ import annotations

from sqlalchemy import text

UPSERT = text(
    "INSERT INTO products (id, name, price, per_user_limit, sale_starts_at, sale_ends_at)"
    " VALUES (:id, COALESCE(:name, :default_name), COALESCE(:price, 0), COALESCE(:limit, 1),"
    " COALESCE(:starts, UTC_TIMESTAMP()), :ends)"
    " ON DUPLICATE KEY UPDATE name = COALESCE(:name, name), price = COALESCE(:price, price),"
    " per_user_limit = COALESCE(:limit, per_user_limit),"
    " sale_starts_at = COALESCE(:starts, sale_starts_at),"
    " sale_ends_at = IF(:ends_given, :ends, sale_ends_at)"
)
"""Create or update product ``:id``; a NULL parameter keeps the stored value, and the sale end
is written only when ``:ends_given``."""

TERMS = text("SELECT price, per_user_limit, sale_starts_at, sale_ends_at FROM products WHERE id = :id")

VIEW = text(
    "SELECT p.id, p.name, p.price, p.per_user_limit, p.sale_starts_at, p.sale_ends_at, i.stock"
    " FROM products p JOIN inventory i ON i.product_id = p.id WHERE p.id = :id"
)

EXISTS = text("SELECT 1 FROM products WHERE id = :id")
