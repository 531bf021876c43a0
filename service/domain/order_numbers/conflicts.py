"""Accepted orders whose order number the consumer found taken by another request's order.

The minter should never hand one number to two requests; when it did anyway (Redis lost the
sequence), ``UNIQUE(order_no)`` stops the second order, and the consumer cannot mint a
number (it holds no shard). It records the order as a final ``rejected``/``order_no_conflict`` row
under its own request id, written under a *stand-in* number derived from that request id (the
row needs a unique ``order_no``), plus one ``order_no_conflicts`` row that leads the buyer from the
number of the 202 to it: ``GET /orders/{order_no}`` answers the buyer's own order, rejected, never
the other buyer's and never 404. No stock is taken; realignment gives the Redis reservation back
as for every rejected order (the journal entry's order number has a row).
"""

from __future__ import annotations

import base64


def stand_in_order_no(request_id: str) -> str:
    """The number an order that lost its order number is written under: the 128 bits of its
    request id (32 hex) in lowercase base32, 26 characters. Deterministic (a redelivery meets its
    own row) and never a number the minter makes (those are two capitals and 24 digits, and pass
    the MOD 97-10 check the API asks of every number it is given)."""
    return base64.b32encode(bytes.fromhex(request_id)).decode("ascii").rstrip("=").lower()
