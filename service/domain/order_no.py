"""Order numbers (seed "Payment Order Number Design").

Layout, 26 characters: prefix (2 letters) + UTC ``yyyyMMddHHmmss`` (14) + shard (2 digits)
+ sequence (6 digits) + check (2 digits). The check digits are ISO 7064 MOD 97-10 over the first
24 characters with letters counted A=10 ... Z=35 as in IBAN (ISO 13616), so an order number is
valid when ``int(digits(all 26)) % 97 == 1``.

The sequence comes from a Redis counter per shard and second (with an expiry), taken in blocks:
one ``INCRBY n`` hands the process ``n`` numbers, given out locally until the block is used or
the second changes (a block's unused rest is a gap, never reused). The shard is a number 00-99
that one running process holds exclusively through a lease in Redis (:class:`ShardLease`); shards
00-89 are leased here, 90-99 are reserved for the MySQL minter of stock mode ``database``
(:mod:`service.domain.order_no_mysql`), so the two never hand out the same number. The
counter still guards uniqueness when a shard changes hands within a second. Past 999,999 in one
second the minter waits for the next second: the sequence never wraps. ``UNIQUE(order_no)`` in
MySQL is the backstop.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import re
import secrets
import time
from collections import deque
from collections.abc import Callable
from datetime import UTC, datetime

import structlog

from service.adapters.redis.stock_store import StockStore
from service.domain.errors import InvalidInput

log = structlog.get_logger(__name__)

ORDER_NO_LENGTH = 26
SEQUENCE_MAX = 999_999
SHARDS = 100
REDIS_SHARDS = 90
"""Shards 00-89 are leased in Redis; 90-99 belong to :mod:`service.domain.order_no_mysql`."""
_ORDER_NO = re.compile(r"[A-Z]{2}[0-9]{24}")
_SPARE_MAX_AGE_SECONDS = 5.0


_IBAN_LETTERS = str.maketrans({chr(ord("A") + i): str(10 + i) for i in range(26)})


def _digits(text: str) -> str:
    """Letters to numbers as in IBAN (A=10 ... Z=35); digits stay (``text`` is ``[A-Z0-9]*``)."""
    return text.translate(_IBAN_LETTERS)


def check_digits(body: str) -> str:
    """ISO 7064 MOD 97-10 check digits (2 characters) for ``body`` (the first 24 characters)."""
    return f"{98 - int(_digits(body + '00')) % 97:02d}"


def is_valid_order_no(value: str) -> bool:
    """True when ``value`` has the length, charset and check digits of an order number."""
    return bool(_ORDER_NO.fullmatch(value)) and int(_digits(value)) % 97 == 1


def compose_order_no(prefix: str, second: str, shard: int, sequence: int) -> str:
    """Build an order number from its parts (``second`` is UTC ``yyyyMMddHHmmss``).

    Raises:
        ValueError: a part is out of range.
    """
    if not re.fullmatch(r"[A-Z]{2}", prefix) or not re.fullmatch(r"[0-9]{14}", second):
        raise ValueError("prefix must be 2 capital letters and second 14 digits")
    if not 0 <= shard < SHARDS or not 0 <= sequence <= SEQUENCE_MAX:
        raise ValueError("shard or sequence out of range")
    body = f"{prefix}{second}{shard:02d}{sequence:06d}"
    return body + check_digits(body)


class ShardLost(RuntimeError):
    """This process no longer holds an order-number shard (Redis unreachable or lease taken)."""


class ShardLease:
    """Exclusive use of one shard (00-99) for this process: SET NX PX, renewed, released on exit.

    ``lease_seconds`` is the lease length; it is renewed every third of it. A process that cannot
    renew in time stops minting (:class:`ShardLost`) until it holds a shard again.
    """

    def __init__(self, store: StockStore, lease_seconds: int) -> None:
        self._store = store
        self._lease_ms = lease_seconds * 1000
        self._token = secrets.token_hex(16)
        self._renewer: asyncio.Task[None] | None = None
        self.shard: int | None = None
        self._valid_until = 0.0

    @property
    def held(self) -> bool:
        return self.shard is not None and time.monotonic() < self._valid_until

    async def acquire(self) -> int:
        """Take a free shard, trying them in random order.

        Raises:
            ShardLost: all 90 Redis shards are leased by other processes.
        """
        start = random.randrange(REDIS_SHARDS)
        for offset in range(REDIS_SHARDS):
            shard = (start + offset) % REDIS_SHARDS
            began = time.monotonic()
            if await self._store.acquire_lease(shard, self._token, self._lease_ms):
                self.shard = shard
                self._valid_until = began + self._lease_ms / 1000 * 0.9
                return shard
        raise ShardLost("all Redis order-number shards are leased")

    async def start(self) -> int:
        """Acquire a shard and keep renewing it in the background."""
        shard = await self.acquire()
        self._renewer = asyncio.create_task(self._renew_forever())
        return shard

    async def _renew_forever(self) -> None:
        while True:
            await asyncio.sleep(self._lease_ms / 3000)
            try:
                began = time.monotonic()
                assert self.shard is not None
                if await self._store.renew_lease(self.shard, self._token, self._lease_ms):
                    self._valid_until = began + self._lease_ms / 1000 * 0.9
                else:
                    log.warning("shard_lease_lost", shard=self.shard)
                    await self.acquire()
                    log.info("shard_lease_acquired", shard=self.shard)
            except Exception as exc:  # Redis down: keep trying; minting stops once the lease lapses
                log.warning("shard_lease_renew_failed", shard=self.shard, error=repr(exc))

    async def stop(self) -> None:
        """Stop renewing and release the shard if still held."""
        if self._renewer is not None:
            self._renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._renewer
        if self.shard is not None:
            with contextlib.suppress(Exception):
                await self._store.release_lease(self.shard, self._token)
            self.shard = None


def _utc_now() -> datetime:
    return datetime.now(UTC)


class OrderNumberMinter:
    """Mints order numbers for this process from its leased shard.

    ``take()`` returns a number that no other caller has; ``give_back()`` returns one that was
    never handed to a client (a rejected purchase), so the reject path costs no Redis call beyond
    the reservation itself. Spares older than five seconds are dropped, so the embedded time
    stays close to the purchase time. ``block`` is how many sequence numbers one Redis call
    takes (1 to 999,999); ``clock`` returns the current UTC time (tests move it).
    """

    def __init__(
        self,
        store: StockStore,
        lease: ShardLease,
        order_no_prefix: str,
        *,
        block: int = 100,
        clock: Callable[[], datetime] = _utc_now,
    ) -> None:
        self._store = store
        self._lease = lease
        self._order_prefix = order_no_prefix
        self._block_size = block
        self._clock = clock
        self._spares: deque[tuple[float, str]] = deque()
        self._block: tuple[int, str, int, int] = (-1, "", 1, 0)
        """(shard, second, next sequence, last sequence) of the block being given out."""
        self._refill = asyncio.Lock()

    def _from_block(self, shard: int, second: str) -> str | None:
        """The next number of the current block if it is for ``shard`` and ``second`` and not used up."""
        block_shard, block_second, sequence, last = self._block
        if block_shard != shard or block_second != second or sequence > last:
            return None
        self._block = (shard, second, sequence + 1, last)
        return compose_order_no(self._order_prefix, second, shard, sequence)

    async def mint(self) -> str:
        """A fresh order number: the next of this process's block for its shard and the current
        UTC second; a new block (one ``INCRBY``) when that is used up or the second changed.

        Raises:
            ShardLost: the process does not hold a shard right now.
            redis.exceptions.RedisError: Redis failed.
        """
        while True:
            if not self._lease.held:
                raise ShardLost("order-number shard lease not held")
            shard = self._lease.shard
            assert shard is not None
            now = self._clock()
            second = now.strftime("%Y%m%d%H%M%S")
            if (order_no := self._from_block(shard, second)) is not None:
                return order_no
            async with self._refill:
                # Another caller may have fetched a block for this second while we waited.
                if (order_no := self._from_block(shard, second)) is not None:
                    return order_no
                last = await self._store.next_sequence(shard, second, self._block_size)
                first = last - self._block_size + 1
                if first <= SEQUENCE_MAX:
                    self._block = (shard, second, first, min(last, SEQUENCE_MAX))
                    order_no = self._from_block(shard, second)
                    assert order_no is not None
                    return order_no
            # This second is used up: never wrap, wait for the next one.
            await asyncio.sleep(1.0 - now.microsecond / 1_000_000 + 0.001)

    async def take(self) -> str:
        """A spare order number if a fresh one is at hand, else a newly minted one."""
        now = time.monotonic()
        while self._spares:
            minted_at, order_no = self._spares.pop()
            if now - minted_at < _SPARE_MAX_AGE_SECONDS:
                return order_no
        return await self.mint()

    def give_back(self, order_no: str) -> None:
        """Keep an order number that was never handed out for the next purchase of this process."""
        self._spares.append((time.monotonic(), order_no))


def require_valid_order_no(order_no: str) -> None:
    """Order numbers coming back in are validated before any look-up (length, charset, ISO 7064
    MOD 97-10 check digits).

    Raises:
        InvalidInput: ``invalid_order_no`` naming the field ``order_no``.
    """
    if not is_valid_order_no(order_no):
        raise InvalidInput("order_no", "not a valid order number (length, charset or check digits)", "invalid_order_no")
