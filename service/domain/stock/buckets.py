"""Stock buckets: a hot product's Redis stock split over K key sets (docs/OPERATIONS.md).

One product's keys share one hash tag, so on Redis Cluster every reserve of the product runs on
one master. With K buckets, bucket ``b`` has its own tag (``{p:ID}`` for 0, ``{p:ID:b}`` for the
others), its own stock, journal, quotas and replay records, and each buyer belongs to one bucket
for good: ``crc32(user_id) % K``. The per-user limit and the replay of an Idempotency-Key stay
exact inside one atomic script, because everything about one buyer lives in one bucket.

K is fixed when the product is created: moving a buyer to another bucket would leave their quota
and replay records behind. Realignment splits the sellable stock over the buckets
(:func:`split`); a buyer whose bucket ran dry while others hold units has the buckets
rebalanced (:mod:`service.domain.stock.rebalance`).
"""

from __future__ import annotations

from zlib import crc32

MAX_BUCKETS = 64
"""The most buckets a product may have (a product's rebalancing pass touches every bucket)."""


def bucket_of(user_id: str, buckets: int) -> int:
    """The bucket (0 .. ``buckets`` - 1) of ``user_id``: CRC-32 (ISO 3309) of its UTF-8 bytes
    modulo ``buckets``; stable across processes and releases (Python's ``hash`` is salted)."""
    return 0 if buckets <= 1 else crc32(user_id.encode()) % buckets


def split(units: int, buckets: int, favour: tuple[int, int] | None = None) -> list[int]:
    """``units`` (>= 0) shared over ``buckets`` as evenly as whole units go, the first buckets
    taking the remainder: ``split(10, 3) == [4, 3, 3]``; the shares add up to ``units``.

    ``favour`` = (bucket, need): a buyer of that bucket asked for ``need`` units, so it gets at
    least ``min(need, units)``, taken from the fullest other buckets (the last of equals) (``split(3, 3, (2, 2)) ==
    [1, 0, 2]``). Without it a short remainder could be spread so that no bucket holds what its
    buyers ask for, and they would be answered ``unavailable`` for as long as they retried."""
    share, extra = divmod(units, buckets)
    shares = [share + (1 if bucket < extra else 0) for bucket in range(buckets)]
    if favour is not None:
        bucket, need = favour
        while shares[bucket] < min(need, units):
            fullest = max((b for b in range(buckets) if b != bucket), key=lambda b: (shares[b], b))
            shares[fullest] -= 1
            shares[bucket] += 1
    return shares
