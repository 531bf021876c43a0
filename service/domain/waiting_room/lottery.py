"""The pre-queue's lottery, reproduced from its record (docs/ARCHITECTURE.md, "Waiting room").

``lua/queue.lua`` gives each buyer who joins before the sale opens the score
``int(sha1(seed + ":" + user id)[:13], 16) / 2**52`` under the room's secret seed, and the
pre-queue is admitted in score order (ties by user id, bytewise: a Redis sorted set's order).
Whoever holds the seed and the entrants gets the same order here.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable


def lottery_score(seed: str, user_id: str) -> int:
    """The buyer's lottery score times 2**52 (an integer: the first 13 hex digits of the SHA-1)."""
    return int(hashlib.sha1(f"{seed}:{user_id}".encode()).hexdigest()[:13], 16)


def drawn_order(seed: str, entrants: Iterable[str]) -> list[str]:
    """The pre-queue's order that ``seed`` draws for ``entrants`` (user ids)."""
    return sorted(entrants, key=lambda user_id: (lottery_score(seed, user_id), user_id.encode()))
