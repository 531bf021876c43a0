"""How far apart events come, and how long a batch of them is worth waiting for: the adaptive
linger of the publisher's groups (:mod:`service.adapters.publish_groups`) and of the consumer's
batches (:mod:`consumers.order_consumer`)."""

from __future__ import annotations

PACE_WEIGHT = 0.1
"""Weight of the latest gap in :class:`Pace`'s moving average."""


class Pace:
    """How far apart items come: an exponentially weighted moving average of the gap per item
    between arrivals (an arrival may bring several items; each gap counted as at most twice
    ``cap``: a quiet hour and a quiet second both say "quiet", and a stampede is recognised
    within a few arrivals), and the linger a new batch should wait: 0 while the average gap is
    ``cap`` or more (fewer than one more item expected within it), else the time ``max_size``
    items take at that pace, at most ``cap``."""

    __slots__ = ("_cap", "_fill", "_gap", "_last")

    def __init__(self, cap: float, max_size: int) -> None:
        self._cap = cap
        self._fill = max(max_size - 1, 1)
        self._gap = 2 * cap  # quiet until arrivals show otherwise
        self._last: float | None = None

    def arrived(self, now: float, items: int = 1) -> None:
        """``items`` arrived at ``now`` (seconds, monotonic)."""
        if self._last is not None:
            gap = min((now - self._last) / max(items, 1), 2 * self._cap)
            self._gap += PACE_WEIGHT * (gap - self._gap)
        self._last = now

    def linger(self) -> float:
        """Seconds a batch opened now waits for more items."""
        if self._gap >= self._cap:
            return 0.0
        return min(self._cap, self._gap * self._fill)
