"""The pure parsers that turn the scripts' Redis replies into the domain's types
(:mod:`service.model.stock`), and the one value format the adapter writes itself.

Nothing here talks to Redis, so every parser can be tested without a server. Replies are the
decoded form (``decode_responses=True``): strings and integers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from service.model.stock import (
    JournalEntry,
    QueuedOrder,
    RealignResult,
    Reservation,
    ReserveOutcome,
)


def parse_reservation(reply: Sequence[Any]) -> Reservation:
    """``{outcome, order_no[, reserved_at_ms, unit_price[, outstanding, held]]}``, ``{'sold_out', '', stock, limit,
    sale_left_ms or -1}``, ``{'rate_limited', '', wait_ms}`` or ``{'rebucket', '', K}`` from ``reserve.lua`` to a
    :class:`Reservation`.

    Raises:
        ValueError: an outcome the script does not return, or a malformed reply.
    """
    if len(reply) == 5:
        outcome, order_no, stock, limit, left_ms = reply
        if outcome != ReserveOutcome.SOLD_OUT:
            raise ValueError(f"reserve reply of 5 elements with outcome {outcome!r}")
        left = int(left_ms)
        return Reservation(
            ReserveOutcome.SOLD_OUT,
            str(order_no),
            stock=int(stock),
            per_user_limit=int(limit),
            sale_left_ms=None if left < 0 else left,
        )
    if len(reply) == 3:
        outcome, order_no, wait_ms = reply
        if outcome == ReserveOutcome.REBUCKET:
            return Reservation(ReserveOutcome.REBUCKET, str(order_no), buckets=int(wait_ms))
        if outcome != ReserveOutcome.RATE_LIMITED:
            raise ValueError(f"reserve reply of 3 elements with outcome {outcome!r}")
        return Reservation(ReserveOutcome.RATE_LIMITED, str(order_no), retry_after_ms=int(wait_ms))
    if len(reply) == 4:
        outcome, order_no, reserved_at_ms, unit_price = reply
        return Reservation(ReserveOutcome(outcome), str(order_no), int(reserved_at_ms), int(unit_price))
    if len(reply) == 6:
        outcome, order_no, reserved_at_ms, unit_price, outstanding, held = reply
        room = (int(outstanding), int(held))
        return Reservation(ReserveOutcome(outcome), str(order_no), int(reserved_at_ms), int(unit_price), room=room)
    outcome, order_no = reply
    return Reservation(ReserveOutcome(outcome), str(order_no))


def _digits(value: str) -> bool:
    return value.isascii() and value.isdigit()


def parse_journal_entry(request_id: str, value: str) -> JournalEntry:
    """One journal field to an entry: ``request id -> user|quantity|order_no|reserved_at_ms|unit_price|claimed``
    or, written before the unit price was recorded (still in a live journal during an upgrade),
    ``user|quantity|order_no|reserved_at_ms|claimed`` (``unit_price`` None). The user id is
    everything left of the last five (four) ``|``. The two shapes cannot be confused: an order
    number always starts with letters, so the third field from the right is all digits
    (``reserved_at_ms``) only in the new one.

    Raises:
        ValueError: the value has neither shape.
    """
    unit_price: int | None = None
    fields = value.rsplit("|", 5)
    if len(fields) == 6 and _digits(fields[3]) and _digits(fields[4]):
        user_id, quantity, order_no, reserved_at_ms, price, claimed = fields
        unit_price = int(price)
    else:
        user_id, quantity, order_no, reserved_at_ms, claimed = value.rsplit("|", 4)
    if claimed not in ("0", "1"):
        raise ValueError(f"journal entry {request_id!r}: claimed flag {claimed!r}")
    return JournalEntry(request_id, user_id, int(quantity), order_no, int(reserved_at_ms), claimed == "1", unit_price)


def parse_realign_reply(reply: Sequence[Any]) -> RealignResult:
    """``{stock_before or '', stock_after, in_flight, in_flight_units, resolved_dropped, stale, held}``
    from ``realign.lua`` to a :class:`RealignResult`.

    Raises:
        ValueError: a malformed reply.
    """
    before, after, in_flight, units, dropped, stale, held = reply
    return RealignResult(
        stock_before=None if before == "" else int(before),
        stock_after=int(after),
        in_flight=int(in_flight),
        in_flight_units=int(units),
        resolved_dropped=int(dropped),
        stale=bool(int(stale)),
        held=int(held),
    )


def parse_queued_order(order_no: str, value: str) -> QueuedOrder:
    """The order view value (``user|product_id|request_id|quantity``) to a :class:`QueuedOrder`.

    Raises:
        ValueError: the value does not have that shape.
    """
    user_id, product_id, request_id, quantity = value.split("|")
    return QueuedOrder(order_no, user_id, int(product_id), request_id, int(quantity))


def format_queued_order(user_id: str, product_id: int, request_id: str, quantity: int) -> str:
    """The order view value written when an order is queued (inverse of :func:`parse_queued_order`)."""
    return f"{user_id}|{product_id}|{request_id}|{quantity}"
