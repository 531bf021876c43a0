"""Recovery that runs by itself wherever the API runs: no person has to run
realignment for the service to heal.

Every API process runs one :class:`Recovery` task. Every ``every_seconds`` (and at once when a
purchase meets a product Redis does not know: :meth:`Recovery.not_loaded`) it tries a short
Redis lock; the process that wins runs one realignment pass over every product, the products
found missing first (those found during the pass too), then releases the lock. So, with one
pass at a time across all processes:

- **Redis lost its data** (FLUSHALL, a failover to an empty replica): the first purchase that
  answers ``not loaded`` for a product MySQL sells through Redis wakes the task; the pass reloads
  the product's stock, sale terms and quotas from MySQL, and purchases are taken again within
  about a second (503 with ``Retry-After`` meanwhile). While a product waits for that pass,
  readiness says ``redis_state: "being repaired"``.
- **Stranded reservations** (the API died between reserve and publish, so the buyer never saw a
  202): the pass publishes every journal entry older than the grace period again (once per
  back-off period, :mod:`service.domain.stock.realign`), so the row appears at most
  ``grace + every_seconds`` + one pass after the reservation, without anyone running
  ``flashsale realign``.
- ``after_pass`` (when given) runs after a pass this process won, at most once a minute: the
  composition root drops dead-lettered copies of orders that have landed since
  (:meth:`service.domain.fulfilment.dead_letters.DeadLetterService.drop_landed`).

The lock only keeps the passes from piling up: two concurrent passes are still exact
(:mod:`service.domain.stock.realign`), so a lock that lapses during a long pass costs work, not
correctness.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections import deque
from collections.abc import Awaitable, Callable

import structlog

from service.adapters.redis.stores import RedisStores
from service.domain.errors import ProductNotFound
from service.domain.stock.realign import Realigner
from service.runtime import stop_task

log = structlog.get_logger(__name__)

LOCK_SECONDS = 60
"""How long the recovery lock is held at most (a process that dies mid-pass frees it then)."""
AFTER_PASS_SECONDS = 60.0
"""The shortest time between two runs of ``after_pass`` in one process."""
_KICK_GAP_SECONDS = 0.5
"""The shortest time between two passes of one process, however often purchases wake it."""


class Recovery:
    """The self-healing task of one API process (see the module docstring).

    ``every_seconds``: the time between passes when nothing wakes the task earlier.
    ``after_pass``: awaited after a pass this process ran, at most every :data:`AFTER_PASS_SECONDS`
    (errors logged, not raised).
    """

    def __init__(
        self,
        realigner: Realigner,
        store: RedisStores,
        every_seconds: float,
        after_pass: Callable[[], Awaitable[object]] | None = None,
    ) -> None:
        self._realigner = realigner
        self._store = store
        self._every = every_seconds
        self._after_pass = after_pass
        self._holder = secrets.token_hex(16)
        self._woken = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._after_pass_at = -AFTER_PASS_SECONDS
        self.repairing: set[int] = set()
        """Products a purchase found missing from Redis that no pass has reloaded yet."""

    def start(self) -> None:
        """Run the task in the background until :meth:`stop`."""
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        """Stop the task (a pass in progress is cancelled; the lock lapses by itself)."""
        if self._task is not None:
            await stop_task(self._task)
            self._task = None

    def not_loaded(self, product_id: int) -> None:
        """A purchase met ``not loaded`` for ``product_id``, which MySQL says sells through
        Redis: Redis lost the product's state. Wakes the task; readiness reports the repair."""
        if product_id not in self.repairing:
            log.warning("redis_state_lost", product_id=product_id)
            self.repairing.add(product_id)
        self._woken.set()

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._woken.wait(), self._every)
            self._woken.clear()
            try:
                await self.run_once()
            except Exception as exc:  # a store is down: the next pass tries again
                log.warning("recovery_pass_failed", error=repr(exc))
            await asyncio.sleep(_KICK_GAP_SECONDS)

    async def run_once(self) -> bool:
        """One pass over every product if this process wins the lock (True), else only forget
        the products another process's pass has reloaded meanwhile (False).

        Raises: whatever Redis, MySQL or RabbitMQ raise (the task logs it and tries again).
        """
        if not await self._store.leases.lock("recovery").acquire(self._holder, LOCK_SECONDS * 1000):
            for product_id in list(self.repairing):
                buckets = await self._realigner.bucket_count(product_id)
                if await self._store.stock.units(product_id, buckets=buckets) is not None:
                    self.repairing.discard(product_id)
            return False
        try:
            rest = deque(p for p in await self._realigner.product_ids() if p not in self.repairing)
            # A product found lost goes next, also when found during the pass (a pass over many
            # products takes a while, and it may already have passed the product)
            while self.repairing or rest:
                product_id = min(self.repairing) if self.repairing else rest.popleft()
                with contextlib.suppress(ProductNotFound):
                    await self._realigner.realign(product_id)
                if product_id in self.repairing:
                    log.warning("redis_state_repaired", product_id=product_id)
                    self.repairing.discard(product_id)
        finally:
            await self._store.leases.lock("recovery").release(self._holder)
        now = asyncio.get_running_loop().time()
        if self._after_pass is not None and now - self._after_pass_at >= AFTER_PASS_SECONDS:
            self._after_pass_at = now
            try:
                await self._after_pass()
            except Exception as exc:
                log.warning("recovery_after_pass_failed", error=repr(exc))
        return True
