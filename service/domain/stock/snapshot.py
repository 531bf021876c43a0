"""What a realignment pass reads of one product in one consistent MySQL snapshot: which journal
entries MySQL resolved (their order row exists), and the sale terms Redis gets
(docs/ARCHITECTURE.md, "Realignment")."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy.ext.asyncio import AsyncConnection

from db.models import OrderStatus
from db.queries import orders
from service.domain.purchase.request_id import reissued_request_id
from service.model.stock import JournalEntry, SaleTerms

_CHUNK = 1000
"""Order numbers looked up per query."""


def sale_terms(
    per_user_limit: int,
    price: int,
    starts_at: datetime,
    ends_at: datetime | None,
    require_token: bool = False,
    buckets: int = 1,
    waiting_room: bool = False,
) -> SaleTerms:
    """The product's sale terms in Redis from its MySQL row: window in Unix milliseconds
    (``ends_ms`` 0 = no end; MySQL times are naive UTC), per-user limit in units, unit price in
    minor currency units, whether a purchase needs an order token, its stock buckets K, whether
    it needs an admission from the waiting room."""

    def epoch_ms(value: datetime | None) -> int:
        return 0 if value is None else int(value.replace(tzinfo=UTC).timestamp() * 1000)

    return SaleTerms(
        epoch_ms(starts_at), epoch_ms(ends_at), per_user_limit, price, int(require_token), buckets, int(waiting_room)
    )


@dataclass(frozen=True, slots=True)
class BucketView:
    """What a pass read of one stock bucket: its journal size before the snapshot (None: Redis
    lost the bucket, or holds it from another life of the server), the run id of the Redis
    server that answered, whether it is realigned incrementally, its journal, and its resolved
    entries (request id -> (entry, rejected))."""

    bucket: int
    size: int | None
    server: str
    incremental: bool
    journal: list[JournalEntry]
    resolved: dict[str, tuple[JournalEntry, bool]]


async def resolved_in(conn: AsyncConnection, journal: list[JournalEntry]) -> dict[str, tuple[JournalEntry, bool]]:
    """The journal entries whose order has a row in the connection's snapshot: request id ->
    (entry, rejected)."""
    by_key = {(entry.order_no, entry.request_id): entry for entry in journal}
    # An order whose request id an older order holds (a key reused after its replay
    # window) is written under a reissued request id (service.domain.fulfilment.order_writer).
    by_key.update({(e.order_no, reissued_request_id(e.request_id, e.order_no)): e for e in journal})
    order_nos = sorted({entry.order_no for entry in journal})
    resolved: dict[str, tuple[JournalEntry, bool]] = {}
    for start in range(0, len(order_nos), _CHUNK):
        rows = await conn.execute(orders.PRESENT_ORDER_STATUSES, {"order_nos": order_nos[start : start + _CHUNK]})
        for order_no, request_id, status in rows:
            entry = by_key.get((order_no, request_id))
            if entry is not None:
                resolved[entry.request_id] = (entry, status == OrderStatus.REJECTED)
    return resolved
