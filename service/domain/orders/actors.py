"""Who changed an order's status (the status log records time, operator and
reason; docs/ARCHITECTURE.md, "Order lifecycle"). Stored in ``order_status_log.actor`` and shown in the order's
``history``; at most 80 characters (user ids and channel names are at most 64).

- ``buyer:<user id>``: the buyer's own request (a database-mode purchase, a cancel);
- ``admin:<user id>``: an operator's request (a refund);
- ``channel:<name>``: a payment channel's statement (a notification, or its answer to a query);
- ``system:<job>``: a job of ours (``consumer``, ``sweep``, ``reconciliation``).
"""

from __future__ import annotations

CONSUMER = "system:consumer"
"""The RabbitMQ consumer writing queued orders (realignment's re-published ones included)."""
SWEEP = "system:sweep"
"""``flashsale sweep``: orders unpaid past the payment window."""
RECONCILIATION = "system:reconciliation"
"""``flashsale reconcile --apply``: a payment on a channel's bill that never reached us."""


def buyer(user_id: str) -> str:
    """The buyer ``user_id`` (JWT ``sub``)."""
    return f"buyer:{user_id}"


def admin(user_id: str) -> str:
    """The operator ``user_id`` (JWT ``sub`` with ``role: admin``)."""
    return f"admin:{user_id}"


def channel(name: str) -> str:
    """The payment channel ``name``."""
    return f"channel:{name}"
