"""Statements on ``refunds``: an operator's refund asked of the channel that took the payment."""

from __future__ import annotations

from sqlalchemy import text

COUNT_OF_ORDER = text("SELECT COUNT(*) FROM refunds WHERE order_no = :o")

INSERT = text(
    "INSERT INTO refunds (refund_no, order_no, channel, payment_txn_id, amount, restock, status)"
    " VALUES (:r, :o, :c, :t, :amount, :restock, 'requested')"
)
"""A refund of order ``:o`` (``:amount`` minor units) asked of channel ``:c`` for its transaction ``:t``."""

OPEN_OF_ORDER = text(
    "SELECT refund_no, channel, payment_txn_id, restock FROM refunds"
    " WHERE order_no = :o AND status = 'requested' ORDER BY id DESC LIMIT 1 FOR UPDATE"
)
"""The refund of order ``:o`` still waiting for its channel's answer, if any."""

SETTLE = text("UPDATE refunds SET status = :s WHERE refund_no = :r AND status = 'requested'")
"""The channel's answer: ``refunded``, ``failed`` or ``rejected``."""
