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
"""The order a channel transaction was recorded for (``UNIQUE(channel, channel_txn_id)``)."""

OWED_PAYMENT = text(
    "SELECT id FROM payments WHERE order_no = :o AND channel = :c AND event = 'paid'"
    " AND status IN ('refunding', 'duplicate', 'mismatch') AND amount = :amount AND currency = :currency"
    " ORDER BY id LIMIT 1 FOR UPDATE"
)
"""The oldest payment of order ``:o`` at channel ``:c`` that could not pay it (late, duplicate or
mismatched: money owed back) of this amount; a refund from that channel settles it first."""

PAID_PAYMENT = text(
    "SELECT id, channel, channel_txn_id, amount, currency, status FROM payments"
    " WHERE order_no = :o AND channel = :c AND channel_txn_id = :t AND event = 'paid' FOR UPDATE"
)
"""The ``paid`` payment of order ``:o`` that channel ``:c`` recorded as transaction ``:t``."""

APPLIED_PAYMENT = text("SELECT id, channel, channel_txn_id, amount, currency FROM payments WHERE idem_key = :idem")
"""The payment that paid an order (``idem_key`` = ``pay:<order_no>:paid``), if any."""

MARK_REFUNDED = text("UPDATE payments SET status = 'refunded' WHERE id = :id")
"""A payment whose money went back to the payer (owed back, or the order was refunded)."""

OF_PRODUCT = text(
    "SELECT p.order_no, p.event, p.status, p.channel, p.channel_txn_id FROM payments p"
    " JOIN orders o ON o.order_no = p.order_no WHERE o.product_id = :p"
)
"""Every payment row of product ``:p``'s orders (the sale's invariant 7)."""

OWED_BACK = text(
    "SELECT channel, channel_txn_id, order_no, amount FROM payments WHERE event = 'paid'"
    " AND status IN ('refunding', 'duplicate', 'mismatch') AND (:c IS NULL OR channel = :c) ORDER BY id"
)
"""Payments still owed back to the payer (reconciliation), of channel ``:c`` or every channel."""

OF_CHANNEL_DAY = text(
    "SELECT channel, channel_txn_id, order_no, event, amount, status FROM payments"
    " WHERE channel = :c AND created_at >= :start AND created_at < :end ORDER BY id"
)
"""Channel ``:c``'s notifications recorded in [``:start``, ``:end``) (naive UTC; reconciliation)."""

BY_CHANNEL_TXN = text("SELECT order_no, event, amount, status FROM payments WHERE channel = :c AND channel_txn_id = :t")
"""One channel transaction as recorded here, or no row."""
