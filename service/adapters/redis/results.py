"""Typed answers of the stock store, and the pure parsers that turn Redis replies into them.

Nothing here talks to Redis, so every parser can be tested without a server. Replies are the
decoded form (``decode_responses=True``): strings and integers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, NamedTuple


class ReserveOutcome(StrEnum):
    """What ``lua/reserve.lua`` decided. Only ``RESERVED`` wrote anything."""

    RESERVED = "reserved"
    REPLAY = "replay"  # the request id was accepted before: answer it again
    IN_FLIGHT = "in_flight"  # the request id is reserved but not yet confirmed by the broker
    KEY_REUSED = "key_reused"  # the request id was used with another quantity
    ABANDONED = "abandoned"  # this attempt was already given up (released before its reserve arrived)
    REBUCKET = "rebucket"  # the product has another number of stock buckets than the caller asked with
    MOVED = "moved"  # the product sells from MySQL (stock mode database), or is switching there
    NOT_LOADED = "not_loaded"  # no stock or sale terms in Redis (never read as 0)
    SALE_NOT_ACTIVE = "sale_not_active"
    OVER_LIMIT = "over_limit"  # quantity alone is above the per-user limit
    LIMIT_EXCEEDED = "limit_exceeded"  # quantity plus the units the user holds is above it
    SOLD_OUT = "sold_out"
    TOKEN_REQUIRED = "token_required"  # the product needs an order token and none was sent
    TOKEN_INVALID = "token_invalid"  # the order token is unknown, expired or another user's
    RATE_LIMITED = "rate_limited"  # the user's or the client address's purchase rate is spent


class ReleaseOutcome(StrEnum):
    """What ``lua/release.lua`` did with the reservation of one attempt (reserve reply lost, or
    publish failed). Only the attempt's own ``pending`` reservation is ever given back."""

    RELEASED = "released"  # stock, per-user quota and journal entry given back; tombstone left
    CLAIMED = "claimed"  # the attempt's order goes through after all (claimed, resolved or re-published)
    ABSENT = "absent"  # the attempt holds nothing (already released, or its reserve never took effect)


class ClaimOutcome(StrEnum):
    """What ``lua/claim.lua`` found for a message a consumer is about to write."""

    HELD = "held"  # journal entry present, now marked claimed
    RELEASED = "released"  # the API gave the reservation back: drop the message
    UNKNOWN = "unknown"  # no trace in Redis: MySQL's unique request id decides


class RestockOutcome(StrEnum):
    """What ``lua/restock.lua`` did with units returned in MySQL."""

    RETURNED = "returned"  # units (and, for a cancel, the per-user quota) are back in Redis
    DONE = "done"  # this order's units were given back before
    REALIGNED = "realigned"  # a realignment whose snapshot held the return already counted them


@dataclass(frozen=True, slots=True)
class Reservation:
    """The answer of one reserve call.

    ``order_no`` is the order number of the reservation (the candidate passed in, or the one of
    the earlier attempt for a replay, ``in_flight``, ``key_reused`` or a retry after a release);
    ``""`` for the other rejections. ``reserved_at_ms`` (Redis server time, Unix milliseconds)
    and ``unit_price`` (minor currency units, from the sale terms in Redis) are set only when
    ``outcome`` is ``RESERVED``, 0 otherwise. For ``SOLD_OUT`` only: ``stock`` (units left, fewer
    than asked for), ``per_user_limit`` (units) and ``sale_left_ms`` (milliseconds until the sale
    ends by Redis's clock; None: no end). For ``RATE_LIMITED`` only: ``retry_after_ms``. For
    ``REBUCKET`` only: ``buckets``, the product's stock buckets K.
    """

    outcome: ReserveOutcome
    order_no: str
    reserved_at_ms: int = 0
    unit_price: int = 0
    stock: int = 0
    per_user_limit: int = 0
    sale_left_ms: int | None = None
    retry_after_ms: int = 0
    buckets: int = 0


def parse_reservation(reply: Sequence[Any]) -> Reservation:
    """``{outcome, order_no[, reserved_at_ms, unit_price]}``, ``{'sold_out', '', stock, limit,
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
    outcome, order_no = reply
    return Reservation(ReserveOutcome(outcome), str(order_no))


@dataclass(frozen=True, slots=True)
class JournalEntry:
    """One reservation in a product's journal: ``quantity`` in units, ``reserved_at_ms`` in Unix
    milliseconds (Redis server time), ``claimed`` once a consumer took its message,
    ``unit_price`` in minor currency units as fixed when the stock was reserved (None for an
    entry written before the journal recorded it)."""

    request_id: str
    user_id: str
    quantity: int
    order_no: str
    reserved_at_ms: int
    claimed: bool = False
    unit_price: int | None = None


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


class SaleTerms(NamedTuple):
    """A product's ``sale`` hash: window in Unix milliseconds (``ends_ms`` 0 = no end), per-user
    limit in units, unit price in minor currency units, ``token`` 1 when a purchase needs an
    order token, ``buckets`` the product's stock buckets K."""

    starts_ms: int
    ends_ms: int
    per_user_limit: int
    price: int
    token: int = 0
    buckets: int = 1


@dataclass(frozen=True, slots=True)
class RealignResult:
    """The answer of one ``realign.lua`` call. Stock and units in units; ``stock_before`` is None
    when the product was not loaded; ``stale``: Redis already reflected a newer MySQL state, so
    nothing was written."""

    stock_before: int | None
    stock_after: int
    in_flight: int
    in_flight_units: int
    resolved_dropped: int
    stale: bool


def parse_realign_reply(reply: Sequence[Any]) -> RealignResult:
    """``{stock_before or '', stock_after, in_flight, in_flight_units, resolved_dropped, stale}``
    from ``realign.lua`` to a :class:`RealignResult`.

    Raises:
        ValueError: a malformed reply.
    """
    before, after, in_flight, units, dropped, stale = reply
    return RealignResult(
        stock_before=None if before == "" else int(before),
        stock_after=int(after),
        in_flight=int(in_flight),
        in_flight_units=int(units),
        resolved_dropped=int(dropped),
        stale=bool(int(stale)),
    )


@dataclass(frozen=True, slots=True)
class QueuedOrder:
    """An order only Redis knows yet (accepted, not yet written to MySQL); ``quantity`` in units."""

    order_no: str
    user_id: str
    product_id: int
    request_id: str
    quantity: int


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
