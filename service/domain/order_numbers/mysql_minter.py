"""Order numbers minted from MySQL: stock mode ``database`` needs no Redis at all (the rollback
plan for Redis-backed stock, docs/OPERATIONS.md: when Redis is down, the hot product is switched
to ``database`` and keeps selling).

Same 26-character layout and ISO 7064 MOD 97-10 check digits as :mod:`service.domain.order_numbers.minter`
(:func:`compose_order_no`). Uniqueness against the Redis minter: shards 90-99 are reserved to
this minter (the Redis minter leases 00-89 only, ``REDIS_SHARDS``). Uniqueness within: one row
of ``order_no_sequences`` per reserved shard holds the last (second, sequence) handed out, and a
block of numbers is taken in one short transaction with that row locked (``SELECT ... FOR
UPDATE``, then ``UPDATE``): the pair only moves forward. The second is the later of the row's
and this process's UTC clock, so clocks that differ between processes (or step back) never make
a pair repeat: at worst a number carries a second slightly ahead. Past 999,999 in one second the
row moves on to the next second (no wait, never a wrap). ``UNIQUE(order_no)`` is the backstop.

The block is taken outside the purchase's transaction, so the counter row is locked for one
short transaction per ``block`` numbers, never for a purchase; each block picks one of the ten
shards at random, so processes rarely queue on the same row. A block is given out for at most
one second after it was taken, so the embedded time stays close to the purchase time; its
unused rest is a gap, never reused.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import deque
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from db.engine import in_transaction
from db.queries import order_no_sequences as queries
from service import metrics
from service.domain.order_numbers.format import REDIS_SHARDS, SEQUENCE_MAX, SHARDS, compose_order_no

_MINT_RETRIED = metrics.retry_counter("mint_order_no")

MYSQL_SHARDS = range(REDIS_SHARDS, SHARDS)
"""The shards only this minter uses (90-99)."""
_SECOND_FORMAT = "%Y%m%d%H%M%S"
_BLOCK_MAX_AGE_SECONDS = 1.0
_SPARE_MAX_AGE_SECONDS = 5.0


def _utc_now() -> datetime:
    return datetime.now(UTC)


def _next_second(second: str) -> str:
    following = datetime.strptime(second, _SECOND_FORMAT) + timedelta(seconds=1)
    return following.strftime(_SECOND_FORMAT)


def advance(stored_second: str, stored_sequence: int, now_second: str, count: int) -> tuple[str, int, int]:
    """The block after a shard's stored (second, last sequence): ``(second, first, last)``, at
    most ``count`` numbers, all strictly after the stored pair. The second is ``now_second``
    unless the stored one is later (another process's clock ran ahead); a used-up second moves
    on to the next one. Seconds compare as strings (fixed-width digits)."""
    second, last = (now_second, 0) if stored_second < now_second else (stored_second, stored_sequence)
    if last >= SEQUENCE_MAX:
        second, last = _next_second(second), 0
    return second, last + 1, min(last + count, SEQUENCE_MAX)


class MysqlOrderNumberMinter:
    """Mints order numbers from ``order_no_sequences`` (see the module docstring). ``take()`` and
    ``give_back()`` as :class:`service.domain.order_numbers.minter.OrderNumberMinter`: a number never handed
    to a client (a rejected purchase) serves the next purchase of this process. ``block`` is how
    many numbers one transaction takes; ``clock`` returns the current UTC time (tests move it).
    """

    def __init__(
        self,
        engine: AsyncEngine,
        order_no_prefix: str,
        *,
        block: int = 100,
        clock: Callable[[], datetime] = _utc_now,
        shards: range = MYSQL_SHARDS,
    ) -> None:
        self._engine = engine
        self._prefix = order_no_prefix
        self._block_size = max(1, min(block, SEQUENCE_MAX))
        self._clock = clock
        self._shards = shards
        self._block: tuple[int, str, int, int, float] = (-1, "", 1, 0, 0.0)
        """(shard, second, next sequence, last sequence, monotonic time taken) of the block being given out."""
        self._spares: deque[tuple[float, str]] = deque()
        self._refill = asyncio.Lock()

    def _from_block(self) -> str | None:
        shard, second, sequence, last, taken_at = self._block
        if sequence > last or time.monotonic() - taken_at >= _BLOCK_MAX_AGE_SECONDS:
            return None
        self._block = (shard, second, sequence + 1, last, taken_at)
        return compose_order_no(self._prefix, second, shard, sequence)

    async def _take_block(self) -> tuple[int, str, int, int]:
        shard = random.choice(self._shards)
        now_second = self._clock().strftime(_SECOND_FORMAT)

        async def reserve(conn: AsyncConnection) -> tuple[int, str, int, int]:
            row = (await conn.execute(queries.LOCKED, {"s": shard})).first()
            if row is None:
                await conn.execute(queries.CREATE, {"s": shard})
                row = (await conn.execute(queries.LOCKED, {"s": shard})).one()
            second, first, last = advance(row.second, int(row.sequence), now_second, self._block_size)
            await conn.execute(queries.ADVANCE, {"s": shard, "second": second, "sequence": last})
            return shard, second, first, last

        return await in_transaction(self._engine, reserve, label="mint_order_no", on_retry=_MINT_RETRIED)

    async def mint(self) -> str:
        """A fresh order number: the next of this process's block, or of a new block.

        Raises:
            service.failures.StoreFailure: MySQL failed (unavailable, or the retries of a deadlock
                or lock wait exhausted; not reached: :class:`~service.failures.StoreUnavailable`).
        """
        if (order_no := self._from_block()) is not None:
            return order_no
        async with self._refill:
            # Another caller may have taken a block while we waited.
            if (order_no := self._from_block()) is not None:
                return order_no
            shard, second, first, last = await self._take_block()
            self._block = (shard, second, first, last, time.monotonic())
            order_no = self._from_block()
            assert order_no is not None
            return order_no

    async def take(self) -> str:
        """A spare order number if a fresh one is at hand, else a newly minted one."""
        now = time.monotonic()
        while self._spares:
            kept_at, order_no = self._spares.pop()
            if now - kept_at < _SPARE_MAX_AGE_SECONDS:
                return order_no
        return await self.mint()

    def give_back(self, order_no: str) -> None:
        """Keep an order number that was never handed out for the next purchase of this process."""
        self._spares.append((time.monotonic(), order_no))
