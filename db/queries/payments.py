"""Statements on ``payments``: the channel's side of an order (amounts in minor units)."""

from __future__ import annotations

from sqlalchemy import text

INSERT = text(
    "INSERT INTO payments (order_no, channel, channel_txn_id, event, amount, currency, status, flagged, raw)"
    " VALUES (:order_no, :channel, :txn, :event, :amount, :currency, :status, :flagged, :raw)"
)
"""One notification under ``UNIQUE(channel, channel_txn_id)`` (1062 when seen before)."""

SETTLE = text("UPDATE payments SET status = :status, flagged = :flagged, idem_key = :idem WHERE id = :id")
"""The outcome of a payment row; ``:idem`` (``biz_type:order_no:event``, UNIQUE) on the row
that changed the order."""

ORDER_OF_TXN = text("SELECT order_no FROM payments WHERE channel = :c AND channel_txn_id = :t")

SETTLE_OWED_REFUND = text(
    "UPDATE payments SET status = 'refunded' WHERE order_no = :o AND event = 'paid'"
    " AND status IN ('refunding', 'duplicate', 'mismatch') AND amount = :amount AND currency = :currency"
    " ORDER BY id LIMIT 1"
)
"""Money owed back for a payment that could not pay order ``:o`` is settled by a refund first."""

OF_PRODUCT = text(
    "SELECT p.order_no, p.event, p.status FROM payments p"
    " JOIN orders o ON o.order_no = p.order_no WHERE o.product_id = :p"
)
"""Every payment row of product ``:p``'s orders (the sale's invariant 7)."""
