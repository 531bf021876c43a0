"""What the stock answers, in the domain's words: the outcomes of a reservation, a release, a
claim and a restock, and the records read back (a reservation, a journal entry, sale terms, a
realignment's result, an order only Redis knows yet).

Plain types only (no I/O, no adapter): the Redis adapter builds them from its replies and the
MySQL purchase path answers with the same :class:`ReserveOutcome` (docs/ARCHITECTURE.md).
"""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass
from enum import StrEnum
from typing import NamedTuple


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
    ADMISSION_REQUIRED = "admission_required"  # waiting room: no valid admission token of this user
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
    RELEASED = "released"  # the API gave back the reservation of the message's own attempt: drop it
    UNKNOWN = "unknown"  # no journal entry nor that attempt's tombstone: MySQL decides


class RestockOutcome(StrEnum):
    """What ``lua/restock.lua`` did with units returned in MySQL."""

    RETURNED = "returned"  # units (and, for a cancel, the per-user quota) are back in Redis
    DONE = "done"  # this order's units were given back before
    REALIGNED = "realigned"  # a realignment whose snapshot held the return already counted them


@dataclass(frozen=True, slots=True)
class ReserveRequest:
    """What one reserve call asks (``lua/reserve.lua``): ``quantity`` units of ``product_id``
    for ``user_id`` under ``request_id``; ``order_no`` is the candidate order number and
    ``attempt`` the token of this HTTP attempt (the one a release must name); ``order_token``
    the ``Order-Token`` header, if any; ``client`` the caller's address (per-address rate);
    ``bucket`` the buyer's stock bucket among the ``buckets`` the caller believes the product
    has; ``admission`` the waiting room's Admission-Token, if any."""

    product_id: int
    request_id: str
    user_id: str
    quantity: int
    order_no: str
    attempt: str
    order_token: str | None = None
    client: str = ""
    _: KW_ONLY
    bucket: int = 0
    buckets: int = 1
    admission: str | None = None


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
    ``REBUCKET`` only: ``buckets``, the product's stock buckets K. ``room``: for ``RESERVED`` on a
    sale with a waiting room, the room's admissions outstanding and units held after it.
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
    room: tuple[int, int] | None = None


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


class SaleTerms(NamedTuple):
    """A product's ``sale`` hash: window in Unix milliseconds (``ends_ms`` 0 = no end), per-user
    limit in units, unit price in minor currency units, ``token`` 1 when a purchase needs an
    order token, ``buckets`` the product's stock buckets K, ``room`` 1 when a purchase needs an
    admission from the product's waiting room."""

    starts_ms: int
    ends_ms: int
    per_user_limit: int
    price: int
    token: int = 0
    buckets: int = 1
    room: int = 0


@dataclass(frozen=True, slots=True)
class RealignResult:
    """The answer of one ``realign.lua`` call. Stock and units in units; ``stock_before`` is None
    when the product was not loaded; ``stale``: Redis already reflected a newer MySQL state, so
    nothing was written. ``held``: units the waiting room keeps for admitted buyers, not in
    ``stock_after`` (not sold either)."""

    stock_before: int | None
    stock_after: int
    in_flight: int
    in_flight_units: int
    resolved_dropped: int
    stale: bool
    held: int = 0


@dataclass(frozen=True, slots=True)
class QueuedOrder:
    """An order only Redis knows yet (accepted, not yet written to MySQL); ``quantity`` in units."""

    order_no: str
    user_id: str
    product_id: int
    request_id: str
    quantity: int
