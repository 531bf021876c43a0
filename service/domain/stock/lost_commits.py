"""Resolved reservations kept in the journal for a while, so that orders whose rows a database
failover lost are written again (docs/ARCHITECTURE.md, "Realignment"; docs/OPERATIONS.md,
"Database failover").

With asynchronous replication, a replica promoted after its primary died may lack the primary's
last commits: orders whose messages the consumer acknowledged, so the broker no longer has them.
Realignment drops a journal entry once its order has a row; dropped at once, such an order
would be silently missing. With ``FLASHSALE_REALIGN__KEEP_RESOLVED_SECONDS`` > 0 an entry
resolved in the snapshot stays in the journal until that long after its reservation, counted as
resolved (not in flight) while its row is there. When the row vanishes, the next pass finds the
entry unresolved again: it is in flight (Redis stock keeps its units), and, older than the grace
period, it is published again (``republish.py``), so the consumer writes the order once more from
the journal (user, quantity, order number, unit price). Each such order is logged
``lost_commit`` with its order number, for the operator.

The promoted replica's inventory versions are behind those realignment recorded in Redis from
the lost primary, so until its own caught up every pass would be judged stale and write nothing:
on finding a lost commit, the pass forgets the recorded versions first.
"""

from __future__ import annotations

import structlog

from service.domain.stock.snapshot import BucketView
from service.model.stock import JournalEntry

log = structlog.get_logger(__name__)


class ResolvedKeeping:
    """Which resolved entries a pass keeps (see the module docstring), and the entries an earlier
    pass of this process saw resolved that have lost their row since."""

    def __init__(self, keep_seconds: float) -> None:
        self._keep_ms = int(keep_seconds * 1000)
        self._seen: dict[tuple[int, int], set[str]] = {}  # (product, bucket) -> request ids kept

    def kept(self, product_id: int, view: BucketView, now_ms: int) -> tuple[dict[str, tuple[JournalEntry, bool]], int]:
        """The entries of ``view`` resolved in its snapshot that stay in the journal (those
        reserved less than the keep period before ``now_ms``, Redis server time), and how many
        entries an earlier pass kept have lost their row since."""
        if self._keep_ms <= 0:
            return {}, 0
        cutoff = now_ms - self._keep_ms
        kept = {rid: found for rid, found in view.resolved.items() if found[0].reserved_at_ms >= cutoff}
        seen = self._seen.get((product_id, view.bucket), set())
        lost = [entry for entry in view.journal if entry.request_id in seen and entry.request_id not in view.resolved]
        for entry in lost:
            log.warning(
                "lost_commit",
                product_id=product_id,
                order_no=entry.order_no,
                request_id=entry.request_id,
                user_id=entry.user_id,
                quantity=entry.quantity,
            )
        self._seen[(product_id, view.bucket)] = set(kept)
        return kept, len(lost)
