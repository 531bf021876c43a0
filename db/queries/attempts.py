"""Statements on ``payment_attempts``: an order's payment at a channel (``open``, ``closed``, ``paid``)."""

from __future__ import annotations

from sqlalchemy import text

OF_ORDER = text("SELECT channel, status FROM payment_attempts WHERE order_no = :o ORDER BY id")
"""Every attempt of order ``:o``, oldest first. Read under the order's row lock, which every
opening holds; not a locking read: its gap locks would deadlock concurrent openings of other
orders (order numbers ascend, so new ones share the index's last gap)."""

OPEN = text(
    "INSERT INTO payment_attempts (order_no, channel, status) VALUES (:o, :c, 'open')"
    " ON DUPLICATE KEY UPDATE status = IF(status = 'closed', 'open', status)"
)
"""Open (or re-open: a closed attempt at the same channel is the same payment) order ``:o``'s
attempt at channel ``:c``."""

SET_STATUS = text("UPDATE payment_attempts SET status = :s WHERE order_no = :o AND channel = :c")
"""Order ``:o``'s attempt at channel ``:c`` becomes ``:s`` (``closed`` or ``paid``)."""

CHANNELS_OF_ORDER = text("SELECT channel FROM payment_attempts WHERE order_no = :o ORDER BY id")
"""The channels where order ``:o`` may have been paid: every attempt, closed ones too (a create
still on the wire when the close arrived can leave an unpaid payment behind a closed attempt)."""

ANY_OPEN = text("SELECT 1 FROM payment_attempts WHERE order_no = :o AND status = 'open' LIMIT 1")
"""Whether order ``:o`` has an attempt still open at a channel (read under the order's row lock)."""
