"""Realignment: make Redis stock = MySQL stock - units of reservations MySQL has not resolved.

Exact while the sale is live. Per product:

1. Open one consistent MySQL snapshot (REPEATABLE READ, ``START TRANSACTION WITH CONSISTENT
   SNAPSHOT``) and read the product's stock in it.
2. Read the product's reservation journal from Redis (HSCAN: bounded work per call).
3. In the same snapshot, find which of those request ids have an order row (resolved).
4. Incremental pass (a journal of more than :data:`FULL_PASS_MAX_ENTRIES` entries, e.g. while
   consumers lag behind): drop the resolved entries a few hundred per Lua call
   (``realign_drop.lua``; a rejected order gives its units back to the buyer's quota), then one
   O(1) Lua call (``realign.lua``) sets ``stock = snapshot stock - units still in the journal``,
   read from a counter the scripts keep, and writes the sale terms from the snapshot. No call
   walks the whole journal, so a big journal never blocks Redis for long.
   Full pass (a smaller journal; or Redis lost the product's stock or counter; or a journal from
   before the counter): one Lua call walks the journal, drops the resolved entries, sets the stock and the counter,
   and rebuilds the per-user quotas (units held in MySQL + units still in the journal), so a
   Redis that lost its data is whole again after one pass.
   A pass whose snapshot is older than what Redis already reflects (another pass wrote or
   dropped entries with a newer snapshot, or returned units reached Redis) writes nothing.

Opening the snapshot before reading the journal is what makes it exact: an entry added after
the journal read was reserved after the snapshot began, so it cannot be in the snapshot and is
rightly counted as unresolved; an entry the snapshot has not seen resolved is counted as in
flight, and a consumer committing it after the snapshot does not change the result (its
decrement is not in the snapshot stock either).

A journal entry older than the grace period with no order row was accepted but its message
never reached MySQL (e.g. the API died between reserve and publish): it is published again (the
consumer's ``UNIQUE(request_id)`` makes that safe), once per back-off period however many passes
run (the grace period, then doubling, at most five minutes; ``republish_due.lua``). It is priced
at the unit price fixed when its stock was reserved (recorded in the journal entry), not at the
product's price now.
"""

from __future__ import annotations

import asyncio
import dataclasses
import secrets
import time
from collections import defaultdict
from typing import cast

import msgspec
import structlog
from sqlalchemy.ext.asyncio import AsyncEngine

from db.models import OrderStatus, StockMode
from db.queries import inventory, orders, products
from service.adapters.broker import Publisher
from service.adapters.redis.stores import RedisStores
from service.domain.errors import ProductNotFound, Unavailable
from service.domain.stock.buckets import bucket_of, split
from service.domain.stock.lost_commits import ResolvedKeeping
from service.domain.stock.realign_report import RealignReport, observe
from service.domain.stock.replay_restore import ReplayRestorer
from service.domain.stock.republish import Republisher
from service.domain.stock.snapshot import BucketView, resolved_in, sale_terms
from service.failures import StoreFailure
from service.model.stock import JournalEntry, RealignResult, SaleTerms
from service.runtime import stop_task

log = structlog.get_logger(__name__)

# A reservation is resolved when its order number has a row written for its request id (or the
# request id the consumer reissued it: a key reused after its replay window): the order
# number, unlike the request id, is new for every accepted purchase (even one reusing an expired
# idempotency key), and the request id tells apart two requests the minter gave one number (the
# second one's row is a rejected one under a stand-in number, found through order_no_conflicts).
# Units a user holds against the per-user limit: every order but cancelled and rejected ones
# (refunded ones included: the buyer did buy; lua/restock.lua keeps the quota for refunds too).
_RELEASED_STATUSES = [OrderStatus.CANCELLED, OrderStatus.REJECTED]
FULL_PASS_MAX_ENTRIES = 2000
"""A journal up to this many entries is realigned in one full Lua call (which also rebuilds the
per-user quotas from MySQL); a bigger one incrementally, a few hundred entries per call (quotas
are then kept by the scripts alone, and rebuilt by the first pass after the journal shrank)."""
LOCK_SECONDS = 5.0
"""A pass over several buckets holds the product's realignment lock this long (seconds), renewed
every third of it while the pass runs: a process that dies mid-pass leaves its buckets drained
until the next pass after at most this long. (A pass that loses its lock anyway is still safe:
the pass numbers fence a stale pass's fills, ``lua/bucket_fill.lua``.)"""
LOCK_WAIT_SECONDS = 30.0
"""How long a pass waits for another pass of the product to release the lock (seconds)."""
STALE_RETRIES = 3
"""A pass over several buckets that a newer MySQL state made stale runs again, this many times."""


class RealignmentBusy(Unavailable):
    """Another realignment pass of the product held its lock for :data:`LOCK_WAIT_SECONDS`."""

    def __init__(self, product_id: int) -> None:
        super().__init__(f"A realignment pass of product {product_id} is running; retry shortly.")
        self.product_id = product_id


class Realigner:
    """Runs realignment passes; ``publisher`` may be None (then nothing is re-published)."""

    def __init__(
        self,
        engine: AsyncEngine,
        store: RedisStores,
        grace_seconds: float,
        publisher: Publisher | None = None,
        keep_resolved_seconds: float = 0.0,
    ) -> None:
        self.engine = engine
        self._keeping = ResolvedKeeping(keep_resolved_seconds)
        self._store = store
        self._grace_ms = int(grace_seconds * 1000)
        self._publisher = publisher
        self._republisher = None if publisher is None else Republisher(store, publisher, self._grace_ms)
        self._replays = ReplayRestorer(engine, store, publisher)
        self._buckets: dict[int, int] = {}

    async def product_ids(self) -> list[int]:
        """Every product that has an inventory row."""
        async with self.engine.connect() as conn:
            rows = await conn.execute(inventory.PRODUCT_IDS)
            return [row[0] for row in rows]

    async def realign_all(self, dry_run: bool = False) -> list[RealignReport]:
        """One pass over every product. A product whose lock another pass holds (one that is
        rebalancing, or whose holder died: the lock expires after :data:`LOCK_SECONDS`) is left
        to the next pass, logged ``realign_busy``; the other products are realigned."""
        reports = []
        for product_id in await self.product_ids():
            try:
                reports.append(await self.realign(product_id, dry_run))
            except RealignmentBusy:
                log.warning("realign_busy", product_id=product_id)
        return reports

    async def realign_pass(self, product_id: int | None, dry_run: bool = False) -> list[RealignReport]:
        """One pass over ``product_id`` (raises :class:`ProductNotFound`), or every product when None."""
        if product_id is None:
            return await self.realign_all(dry_run)
        return [await self.realign(product_id, dry_run)]

    async def realign(
        self, product_id: int, dry_run: bool = False, *, open_sale: bool = False, favour: tuple[int, int] | None = None
    ) -> RealignReport:
        """One exact pass for one product (see the module docstring). A product in stock mode
        ``database`` gets the Redis marker that makes reserves answer ``moved``; ``open_sale``
        (the switch to ``redis`` mode, after MySQL says ``redis``) removes it in the same
        atomic write that loads the stock.

        A product of several stock buckets is rebalanced by a writing pass: under the product's
        realignment lock (one pass at a time, whichever process), every bucket is drained and
        then filled with its share of MySQL stock - units in flight in all buckets
        (:func:`~service.domain.stock.buckets.split`; ``favour`` = (bucket, units): a rebalancing pass
        for a buyer of that bucket who asked for that many); a pass made stale by a newer MySQL state is run
        again with a new snapshot, up to :data:`STALE_RETRIES` times.

        Raises:
            ProductNotFound: the product has no inventory row in MySQL.
            RealignmentBusy: another pass of the product held its lock for :data:`LOCK_WAIT_SECONDS`.
        """
        buckets = await self.bucket_count(product_id)
        if buckets == 1 or dry_run:
            return await self._pass(product_id, dry_run, open_sale, 0)
        holder = secrets.token_hex(8)
        lock = f"realign:{product_id}"
        deadline = time.monotonic() + LOCK_WAIT_SECONDS
        lock_ms = round(LOCK_SECONDS * 1000)
        while not await self._store.leases.lock(lock).acquire(holder, lock_ms):
            if time.monotonic() >= deadline:
                raise RealignmentBusy(product_id)
            await asyncio.sleep(0.05)
        renewing = asyncio.create_task(self._keep_lock(lock, holder, lock_ms))
        try:
            for _ in range(STALE_RETRIES + 1):
                pass_no = await self._store.buckets.next_pass(product_id)
                report = await self._pass(product_id, False, open_sale, pass_no, favour)
                if not report.skipped_stale:
                    break
            return report
        finally:
            await stop_task(renewing)
            await self._store.leases.lock(lock).release(holder)

    async def _keep_lock(self, lock: str, holder: str, lock_ms: int) -> None:
        """Renew ``holder``'s ``lock`` every third of ``lock_ms`` until cancelled; a failed renewal
        is logged and tried again (the pass numbers keep a pass that lost its lock harmless)."""
        while True:
            await asyncio.sleep(lock_ms / 3000)
            try:
                if not await self._store.leases.lock(lock).renew(holder, lock_ms):
                    log.warning("realign_lock_lost", lock=lock)
            except StoreFailure as exc:
                log.warning("realign_lock_renewal_failed", lock=lock, error=repr(exc))

    async def bucket_count(self, product_id: int) -> int:
        """The product's stock buckets K (fixed at creation, so kept once read; 1 for a product
        MySQL does not have, whose pass then raises :class:`ProductNotFound`)."""
        if (known := self._buckets.get(product_id)) is not None:
            return known
        async with self.engine.connect() as conn:
            buckets = (await conn.execute(products.BUCKETS, {"id": product_id})).scalar()
        if buckets is None:
            return 1
        self._buckets[product_id] = int(buckets)
        return int(buckets)

    async def _pass(
        self, product_id: int, dry_run: bool, open_sale: bool, pass_no: int, favour: tuple[int, int] | None = None
    ) -> RealignReport:
        """One snapshot and one ``realign.lua`` call per bucket; with ``pass_no`` > 0 (a writing
        pass over several buckets) the buckets are drained, then filled."""
        buckets = await self.bucket_count(product_id)
        sizes = [await self._store.stock.journal_size(product_id, bucket=bucket) for bucket in range(buckets)]
        views: list[BucketView] = []
        async with self.engine.connect() as conn:
            conn = await conn.execution_options(isolation_level="REPEATABLE READ")
            await conn.exec_driver_sql("START TRANSACTION WITH CONSISTENT SNAPSHOT")
            row = (await conn.execute(inventory.SNAPSHOT, {"p": product_id})).first()
            if row is None:
                await conn.rollback()
                raise ProductNotFound(product_id)
            mysql_stock, mysql_sold, version = row.stock, row.sold, row.version
            for bucket, (size, server) in enumerate(sizes):
                journal = await self._store.stock.journal(product_id, bucket=bucket)
                incremental = size is not None and size > FULL_PASS_MAX_ENTRIES
                views.append(BucketView(bucket, size, server, incremental, journal, await resolved_in(conn, journal)))
            held: dict[int, list[tuple[str, int]]] = defaultdict(list)
            if not all(view.incremental for view in views):
                found = await conn.execute(orders.UNITS_HELD, {"p": product_id, "released": _RELEASED_STATUSES})
                for user_id, units in found:
                    held[bucket_of(user_id, buckets)].append((user_id, int(units)))
            await conn.rollback()

        terms = sale_terms(
            row.per_user_limit,
            row.price,
            row.sale_starts_at,
            row.sale_ends_at,
            row.require_token,
            buckets,
            row.waiting_room,
        )
        if row.stock_mode == StockMode.DATABASE:
            marker = "database"
        else:
            marker = "open" if open_sale else "keep"
        lost = {view.bucket for view in views if view.size is None}
        if lost and not dry_run:
            # A product that sold nothing has no order to wait for (its first load, typically).
            await self._replays.restore(product_id, buckets, lost, after_sales=mysql_sold > 0)
        results: list[RealignResult] = []
        now_ms = await self._store.stock.server_time_ms()
        for view in views:
            kept, vanished = ({}, 0) if dry_run else self._keeping.kept(product_id, view, now_ms)
            if vanished:
                await self._store.stock.forget_versions(product_id, bucket=view.bucket)
            result = await self._realign_bucket(
                product_id, view, kept, version, mysql_stock, terms, held[view.bucket], dry_run, marker, pass_no
            )
            if result is None:  # Redis lost the bucket's state meanwhile: a full pass, new snapshot
                return await self._pass(product_id, dry_run, open_sale, pass_no, favour)
            results.append(result)
        in_flight_units = sum(result.in_flight_units for result in results)
        stale = any(result.stale for result in results)
        stock_after = results[0].stock_after
        if buckets > 1:
            stock_after = max(mysql_stock - in_flight_units, 0)
            if pass_no and not stale:
                for bucket, share in enumerate(split(stock_after, buckets, favour)):
                    stale = not await self._store.buckets.fill(product_id, bucket, pass_no, share) or stale
        befores = [result.stock_before for result in results]

        republished = 0
        if not dry_run and self._republisher is not None:
            for view in views:
                republished += await self._republisher.overdue(
                    product_id, row.price, view.journal, view.resolved.keys(), view.bucket, now_ms - self._grace_ms
                )

        report = RealignReport(
            product_id=product_id,
            mysql_stock=mysql_stock,
            mysql_sold=mysql_sold,
            redis_stock_before=None if None in befores else sum(cast(list[int], befores)),
            redis_stock_after=stock_after,
            in_flight=sum(result.in_flight for result in results),
            in_flight_units=in_flight_units,
            drift=None if None in befores else sum(cast(list[int], befores)) - stock_after,
            resolved_dropped=sum(result.resolved_dropped for result in results),
            republished=republished,
            dry_run=dry_run,
            skipped_stale=stale,
            redis_held=sum(result.held for result in results),
        )
        # a dry run is a read (the stock report, the ops page polling it): not worth an info line
        (log.debug if dry_run else log.info)("realigned", **msgspec.structs.asdict(report))
        observe(report)
        return report

    async def _realign_bucket(
        self,
        product_id: int,
        view: BucketView,
        kept: dict[str, tuple[JournalEntry, bool]],
        version: int,
        mysql_stock: int,
        terms: SaleTerms,
        units_held: list[tuple[str, int]],
        dry_run: bool,
        marker: str,
        pass_no: int,
    ) -> RealignResult | None:
        """The Lua side of one bucket's pass (incremental or full, see the module docstring),
        the resolved entries in ``kept`` left in the journal; None when Redis lost the bucket's
        state since it was read."""
        dropped = 0
        drop = {request_id: found for request_id, found in view.resolved.items() if request_id not in kept}
        pending = (len(view.resolved), sum(entry.quantity for entry, _ in view.resolved.values()))
        if view.incremental and not dry_run:
            dropped, _ = await self._store.stock.drop_resolved(
                product_id,
                version,
                [(request_id, entry.order_no, rejected) for request_id, (entry, rejected) in drop.items()],
                bucket=view.bucket,
            )
            pending = (len(kept), sum(entry.quantity for entry, _ in kept.values()))
        result = await self._store.stock.realign(
            product_id,
            mysql_stock=mysql_stock,
            inventory_version=version,
            terms=terms,
            resolved=None if view.incremental else list(drop),
            kept=list(kept),
            units_held=units_held,
            pending=pending,
            dry_run=dry_run,
            server=view.server,
            marker=marker,
            bucket=view.bucket,
            pass_no=pass_no,
        )
        if result is not None and view.incremental:
            result = dataclasses.replace(result, resolved_dropped=len(view.resolved) if dry_run else dropped)
        return result
