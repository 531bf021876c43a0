"""Minting order numbers from Redis (the format is :mod:`service.domain.order_numbers.format`).

The 6-digit sequence is the shard's generation digit followed by a 5-digit counter. The counter
comes from Redis, one per shard and second (with an expiry), taken in blocks: one ``INCRBY n``
hands the process ``n`` numbers, given out locally until the block is used or the second changes
(a block's unused rest is a gap, never reused). The shard is a number 00-99 that one running
process holds exclusively through a lease in Redis (:class:`ShardLease`); shards 00-89 are
leased here, 90-99 are reserved for the MySQL minter of stock mode ``database``
(:mod:`service.domain.order_numbers.mysql_minter`), so the two never hand out the same number. The counter still
guards uniqueness when a shard changes hands within a second. Past 99,999 in one second the
minter waits for the next second: the counter never wraps.

Generations (what makes a number unique whatever Redis forgets): a counter restarts when Redis
loses it (FLUSHALL, a failover to an empty or lagging replica, a restart that replays an AOF
missing its last second). Each shard has a generation in MySQL (``order_no_generations``), and
its epoch in Redis says which generation it mints in and on which server (run id) that epoch was
installed; ``lua/mint.lua`` hands out a block only while both still hold. A minter that meets a
missing or foreign epoch moves the shard's generation on in MySQL (a conditional UPDATE: one
minter wins each step) and installs the new one, so every number minted after the loss carries
another generation digit than any number minted before it. Two numbers can only meet if one
shard's generation went round all ten digits within the same UTC second. ``UNIQUE(order_no)`` in
MySQL is the backstop.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import secrets
import time
from collections import deque
from collections.abc import Callable
from datetime import UTC, datetime

import structlog
from sqlalchemy.ext.asyncio import AsyncEngine

from db.queries import order_no as generations_sql
from service.adapters.redis.stores import RedisStores
from service.domain.order_numbers.format import COUNTER_MAX, REDIS_SHARDS, compose_in_range
from service.failures import StoreFailure
from service.runtime import stop_task

log = structlog.get_logger(__name__)

_SPARE_MAX_AGE_SECONDS = 5.0
_ESTABLISH_TRIES = 40
"""How often one mint tries to establish its shard's epoch (0.05 s apart) before it gives up."""


class ShardLost(RuntimeError):
    """This process cannot mint right now: it holds no order-number shard (Redis unreachable or
    lease taken), or MySQL could not say the shard's generation."""


class ShardsExhausted(ShardLost):
    """Every Redis order-number shard (00-89, :data:`REDIS_SHARDS`) is leased by another process:
    the fleet limit of :data:`REDIS_SHARDS` API worker processes per key prefix is reached."""


async def leased_shards(store: RedisStores) -> int:
    """How many of the :data:`REDIS_SHARDS` Redis shards some process leases right now (one
    round trip per Redis node)."""
    return await store.leases.leased_shards(REDIS_SHARDS)


class ShardGenerations:
    """The generation of each order-number shard, in MySQL (survives whatever Redis forgets)."""

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine

    async def current(self, shard: int) -> int:
        """Shard ``shard``'s generation (0 before its first epoch)."""
        async with self._engine.connect() as conn:
            return int((await conn.execute(generations_sql.GENERATION, {"s": shard})).scalar_one())

    async def bump(self, shard: int, seen: int) -> bool:
        """Move ``shard`` from generation ``seen`` to ``seen + 1``; False when another minter
        moved it first."""
        async with self._engine.begin() as conn:
            return (await conn.execute(generations_sql.BUMP, {"s": shard, "g": seen})).rowcount == 1


LAPSED_RETRY_SECONDS = 0.5
"""Least time between two renewals of a shard lease (callers that meet it lapsed ask for one)."""

LAPSED_WAIT_SECONDS = 1.0
"""How long a mint that meets a lapsed lease waits for the renewal it asked for: time enough for
one renewal round trip after the retry spacing, short enough that a Redis really away is a fast
503."""


class ShardLease:
    """Exclusive use of one shard (00-99) for this process: SET NX PX, renewed, released on exit.

    ``lease_seconds`` is the lease length; it is renewed every third of it. A process that cannot
    renew in time stops minting (:class:`ShardLost`) until it holds a shard again; a minter that
    meets the lapsed lease asks for that at once and waits briefly for the answer
    (:meth:`regained`), so minting resumes as soon as Redis answers again, not up to a third of
    the lease later (a Redis paused 40 s: 6 s more of 503s, docs/RELIABILITY.md). A lease that
    lapsed only because this process did not run (a paused VM, a long GC, a stopped event loop)
    costs its first purchase a renewal round trip, not a 503.
    """

    def __init__(self, store: RedisStores, lease_seconds: int) -> None:
        self._store = store
        self._lease_ms = lease_seconds * 1000
        self._token = secrets.token_hex(16)
        self._renewer: asyncio.Task[None] | None = None
        self.shard: int | None = None
        self._valid_until = 0.0
        self._lapsed = asyncio.Event()
        self._attempted = asyncio.Event()  # replaced after each renewal attempt, which sets it

    @property
    def held(self) -> bool:
        return self.shard is not None and time.monotonic() < self._valid_until

    async def acquire(self) -> int:
        """Take a free shard, trying them in random order.

        Raises:
            ShardsExhausted: all 90 Redis shards are leased by other processes.
        """
        start = random.randrange(REDIS_SHARDS)
        for offset in range(REDIS_SHARDS):
            shard = (start + offset) % REDIS_SHARDS
            began = time.monotonic()
            if await self._store.leases.shard(shard).acquire(self._token, self._lease_ms):
                self.shard = shard
                self._valid_until = began + self._lease_ms / 1000 * 0.9
                return shard
        raise ShardsExhausted(
            f"all {REDIS_SHARDS} Redis order-number shards (00-{REDIS_SHARDS - 1}) are leased: at most "
            f"{REDIS_SHARDS} API worker processes can share one key prefix"
        )

    async def start(self) -> int:
        """Acquire a shard and keep renewing it in the background."""
        shard = await self.acquire()
        self._renewer = asyncio.create_task(self._renew_forever())
        return shard

    async def regained(self, within: float = LAPSED_WAIT_SECONDS) -> bool:
        """A caller found the lease not held: renew it (or take another shard) now, and wait up
        to ``within`` seconds for that; True when the lease is held again."""
        self._lapsed.set()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(within):
                while not self.held and self._renewer is not None and not self._renewer.done():
                    await self._attempted.wait()
        return self.held

    async def _renew_forever(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._lapsed.wait(), self._lease_ms / 3000)
            self._lapsed.clear()
            try:
                began = time.monotonic()
                assert self.shard is not None
                if await self._store.leases.shard(self.shard).renew(self._token, self._lease_ms):
                    self._valid_until = began + self._lease_ms / 1000 * 0.9
                else:
                    log.warning("shard_lease_lost", shard=self.shard)
                    await self.acquire()
                    log.info("shard_lease_acquired", shard=self.shard)
            except Exception as exc:  # Redis down: keep trying; minting stops once the lease lapses
                log.warning("shard_lease_renew_failed", shard=self.shard, error=repr(exc))
            attempted, self._attempted = self._attempted, asyncio.Event()
            attempted.set()
            await asyncio.sleep(LAPSED_RETRY_SECONDS)  # callers meeting a lapsed lease ask at most this often

    async def stop(self) -> None:
        """Stop renewing and release the shard if still held."""
        if self._renewer is not None:
            await stop_task(self._renewer)
        if self.shard is not None:
            with contextlib.suppress(Exception):
                await self._store.leases.shard(self.shard).release(self._token)
            self.shard = None


def _utc_now() -> datetime:
    return datetime.now(UTC)


class OrderNumberMinter:
    """Mints order numbers for this process from its leased shard.

    ``take()`` returns a number that no other caller has; ``give_back()`` returns one that a
    reserve call answered without using (a definite rejection), so the reject path costs no Redis
    call beyond the reservation itself. Spares older than five seconds are dropped, so the
    embedded time stays close to the purchase time, and every spare is dropped when the shard's
    epoch changes. ``block`` is how many counter values one Redis call takes (1 to 99,999);
    ``clock`` returns the current UTC time (tests move it).
    """

    def __init__(
        self,
        store: RedisStores,
        lease: ShardLease,
        order_no_prefix: str,
        generations: ShardGenerations,
        *,
        block: int = 100,
        clock: Callable[[], datetime] = _utc_now,
    ) -> None:
        self._store = store
        self._lease = lease
        self._order_prefix = order_no_prefix
        self._generations = generations
        self._block_size = min(block, COUNTER_MAX)
        self._clock = clock
        self._spares: deque[tuple[float, str]] = deque()
        self._block: tuple[int, str, int, int, int] = (-1, "", 0, 1, 0)
        """(shard, second, generation digit, next counter, last counter) of the block being given out."""
        self._epoch: tuple[int, int] | None = None
        """(shard, generation) this process mints in, once established."""
        self._refill = asyncio.Lock()
        self._second: tuple[datetime | None, str] = (None, "")
        self._refill_failure: Exception | None = None
        """The error of the last block refill that failed (raised again to the callers that waited for it)."""

    def _second_of(self, now: datetime) -> str:
        """``now`` as UTC ``yyyyMMddHHmmss``, formatted once per second."""
        whole = now.replace(microsecond=0)
        if whole != self._second[0]:
            self._second = (whole, whole.strftime("%Y%m%d%H%M%S"))
        return self._second[1]

    def _from_block(self, shard: int, second: str) -> str | None:
        """The next number of the current block if it is for ``shard`` and ``second`` and not used up."""
        block_shard, block_second, digit, counter, last = self._block
        if block_shard != shard or block_second != second or counter > last:
            return None
        self._block = (shard, second, digit, counter + 1, last)
        return compose_in_range(self._order_prefix, second, shard, digit * (COUNTER_MAX + 1) + counter)

    async def _generation(self, shard: int) -> int:
        """The generation ``shard`` mints in on this Redis server, moving it on in MySQL and
        installing it in Redis when the shard's epoch is missing or foreign (see the module
        docstring). Exactly one minter wins each step; the others adopt what it installed.

        Raises:
            ShardLost: not established after :data:`_ESTABLISH_TRIES` tries (MySQL kept failing).
            service.failures.StoreUnavailable: Redis failed.
        """
        if self._epoch is not None and self._epoch[0] == shard:
            return self._epoch[1]
        for _ in range(_ESTABLISH_TRIES):
            generation, current = await self._store.sequences.epoch(shard)
            if generation is not None and current:
                break
            try:
                seen = await self._generations.current(shard)
                won = await self._generations.bump(shard, seen)
            except StoreFailure as exc:  # e.g. too many connections: try again shortly
                log.warning("order_no_generation_unavailable", shard=shard, error=repr(exc))
                await asyncio.sleep(0.05)
                continue
            if won:
                generation, current = await self._store.sequences.epoch(shard, install=seen + 1)
                # Generation 1 is a shard's first epoch; a later one means Redis forgot the epoch.
                report = log.info if seen == 0 else log.warning
                report("order_no_generation_moved", shard=shard, generation=seen + 1, installed=generation)
                if generation is not None and current:
                    break
            await asyncio.sleep(0.05)  # another minter won the step: it installs the new epoch
        else:
            raise ShardLost(f"order-number epoch of shard {shard} not established")
        assert generation is not None
        self._epoch = (shard, generation)
        self._spares.clear()
        return generation

    async def mint(self) -> str:
        """A fresh order number: the next of this process's block for its shard and the current
        UTC second; a new block (one ``lua/mint.lua`` call) when that is used up or the second
        changed, after establishing the shard's generation again if Redis lost its epoch.

        Raises:
            ShardLost: the process does not hold a shard right now, MySQL failed while the
                shard's generation had to move on, or the block refill this call queued behind
                failed (so a stalled Redis costs each waiting caller one refill, not one each).
            service.failures.StoreUnavailable: Redis failed.
        """
        resets = 0
        while True:
            if not self._lease.held and not await self._lease.regained():
                raise ShardLost("order-number shard lease not held")
            shard = self._lease.shard
            assert shard is not None
            now = self._clock()
            second = self._second_of(now)
            if (order_no := self._from_block(shard, second)) is not None:
                return order_no
            failed_before = self._refill_failure
            async with self._refill:
                # Another caller may have fetched a block for this second while we waited.
                if (order_no := self._from_block(shard, second)) is not None:
                    return order_no
                if self._refill_failure is not failed_before:  # only ever set to an exception, never reset
                    # The refill this call waited for failed (Redis stalled or down): the callers
                    # queued behind it fail with it rather than each wait out Redis in turn.
                    raise ShardLost(f"the order-number block refill waited for failed: {self._refill_failure!r}")
                try:
                    generation = await self._generation(shard)
                    last = await self._store.sequences.mint_block(shard, generation, second, self._block_size)
                except Exception as exc:
                    self._refill_failure = exc
                    raise
                if last is None:  # Redis lost the epoch (and maybe the counter) since it was established
                    log.warning("order_no_epoch_lost", shard=shard, generation=generation)
                    self._epoch = None
                    self._spares.clear()
                    resets += 1
                    if resets > _ESTABLISH_TRIES:  # Redis keeps changing under us: answer 503, not spin
                        raise ShardLost(f"order-number epoch of shard {shard} keeps changing")
                    continue
                first = last - self._block_size + 1
                if first <= COUNTER_MAX:
                    self._block = (shard, second, generation % 10, first, min(last, COUNTER_MAX))
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
        """Keep an order number that a reserve call answered without using (a definite
        rejection; never after an unknown outcome) for the next purchase of this process."""
        self._spares.append((time.monotonic(), order_no))
