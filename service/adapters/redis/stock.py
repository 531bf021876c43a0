"""A product's stock in Redis as realignment and the stock modes see it: units left, per-user
quotas, the reservation journal, the realignment script that loads stock from MySQL's figure,
and the stock-mode marker.

Failures raise :class:`~service.failures.StoreUnavailable` ``("redis")`` only
(:mod:`.boundary`).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from typing import cast

from service.adapters.redis.boundary import translated
from service.adapters.redis.client import RedisClient
from service.adapters.redis.keys import ProductKeys
from service.adapters.redis.replies import parse_journal_entry, parse_realign_reply
from service.adapters.redis.restock_channel import RestockChannel
from service.adapters.redis.scripts import KeyspaceStore, Scripts
from service.model.stock import JournalEntry, RealignResult, SaleTerms

SCAN_COUNT = 1000
"""Journal entries one HSCAN call asks for (bounded work per Redis call)."""
DROP_BATCH = 500
"""Journal entries one ``realign_drop.lua`` / ``republish_due.lua`` call handles, at most."""


class Stock(KeyspaceStore):
    """The stock of the products of one key prefix."""

    def __init__(self, redis: RedisClient, scripts: Scripts, restocks: RestockChannel, key_prefix: str) -> None:
        super().__init__(redis, scripts, key_prefix)
        self._restocks = restocks

    @translated
    async def units(self, product_id: int, *, buckets: int = 1) -> int | None:
        """Units Redis can still sell over the product's ``buckets``, or None when the product
        (any of its buckets) is not loaded. One pipeline (on a cluster, one round trip per node)."""
        if buckets == 1:
            value = await self._redis.get(ProductKeys(self._prefix, product_id).stock)
            return None if value is None else int(value)
        async with self._redis.pipeline(transaction=False) as pipe:
            for bucket in range(buckets):
                pipe.get(ProductKeys(self._prefix, product_id, bucket).stock)
            stocks = await pipe.execute()
        return None if None in stocks else sum(int(stock) for stock in stocks)

    @translated
    async def quota(self, product_id: int, *, buckets: int = 1) -> dict[str, int]:
        """Units each user holds against the per-user limit (users holding none are absent), over
        the product's ``buckets`` (each user's units are in their own bucket)."""
        held: dict[str, int] = {}
        for bucket in range(buckets):
            raw = cast(dict[str, str], await self._redis.hgetall(ProductKeys(self._prefix, product_id, bucket).quota))
            held.update((user_id, int(units)) for user_id, units in raw.items())
        return held

    @translated
    async def server_time_ms(self) -> int:
        """Redis server time in Unix milliseconds (the clock of ``reserved_at_ms``)."""
        seconds, micros = await self._redis.time()
        return int(seconds) * 1000 + int(micros) // 1000

    @translated
    async def forget_versions(self, product_id: int, *, bucket: int = 0) -> None:
        """Drop the inventory versions Redis reflects (``synced``, ``dropped``, ``restocked``):
        they belong to a MySQL history a database failover lost, and the next pass must not be
        judged stale against them (:mod:`service.domain.stock.lost_commits`)."""
        versions = ProductKeys(self._prefix, product_id, bucket).versions
        await self._redis.hdel(versions, "synced", "dropped", "restocked")

    @translated
    async def mark_moved(self, product_id: int, *, buckets: int = 1) -> None:
        """Write the stock-mode marker ``mode = database`` into the sale terms of each of the
        product's ``buckets``: from each write on, a reserve in that bucket answers ``MOVED``
        and takes nothing (the first step of a switch to MySQL; one HSET per bucket, atomic
        against every reserve there)."""
        for bucket in range(buckets):
            await self._redis.hset(ProductKeys(self._prefix, product_id, bucket).sale, "mode", "database")

    @translated
    async def journal(self, product_id: int, *, bucket: int = 0) -> list[JournalEntry]:
        """Every reservation in the product's journal, in no particular order: HSCAN, about
        :data:`SCAN_COUNT` entries per call, so no call blocks Redis for long however big the
        journal is (an entry present throughout the scan is returned; one added or removed
        meanwhile may or may not be, and one may come twice: kept once).

        Raises:
            ValueError: an entry of neither journal shape (:func:`.replies.parse_journal_entry`).
        """
        entries: dict[str, JournalEntry] = {}
        key = ProductKeys(self._prefix, product_id, bucket).journal
        async for request_id, value in self._redis.hscan_iter(key, count=SCAN_COUNT):
            entries[request_id] = parse_journal_entry(request_id, value)
        return list(entries.values())

    @translated
    async def journal_size(self, product_id: int, *, bucket: int = 0) -> tuple[int | None, str]:
        """``lua/journal_size.lua``: entries in the product's journal (HLEN), or None when Redis
        does not hold the bucket as it was loaded (its stock or journal-units counter is missing,
        or it was loaded in another life of the server: a restart from older data, a promoted
        replica); then only a full realignment pass can restore it, else a pass may be
        incremental (:meth:`drop_resolved`, :meth:`realign`). With it, the run id of the Redis
        server that answered (what :meth:`realign` writes on)."""
        keys = ProductKeys(self._prefix, product_id, bucket)
        size, server = await self._scripts.run(
            "journal_size", keys=[keys.stock, keys.units, keys.journal, keys.sale], args=[]
        )
        return (None if int(size) < 0 else int(size)), str(server)

    async def drop_resolved(
        self, product_id: int, inventory_version: int, resolved: Sequence[tuple[str, str, bool]], *, bucket: int = 0
    ) -> tuple[int, int]:
        """``lua/realign_drop.lua``, :data:`DROP_BATCH` entries per call: drop the journal
        entries of ``resolved`` = (request id, order number, rejected) whose order has a row in
        the snapshot of ``inventory_version``; a rejected one gives its units back to the buyer's
        quota. Returns (entries, units) dropped."""
        keys = ProductKeys(self._prefix, product_id, bucket)
        entries = units = 0
        for start in range(0, len(resolved), DROP_BATCH):
            batch = resolved[start : start + DROP_BATCH]
            dropped, dropped_units = await self._scripts.run(
                "realign_drop",
                keys=[keys.journal, keys.units, keys.quota, keys.versions, keys.republished],
                args=[
                    inventory_version,
                    *(
                        value
                        for request_id, order_no, rejected in batch
                        for value in (request_id, order_no, int(rejected))
                    ),
                ],
            )
            entries += int(dropped)
            units += int(dropped_units)
        return entries, units

    async def republish_due(
        self,
        product_id: int,
        request_ids: Sequence[str],
        first_seconds: float,
        longest_seconds: float,
        *,
        bucket: int = 0,
    ) -> list[str]:
        """``lua/republish_due.lua``: of ``request_ids`` (overdue reservations), the ones to
        publish again now, marked so: each at most once per back-off period, which starts at
        ``first_seconds`` and doubles with each re-publish up to ``longest_seconds``, whichever
        process asks. :data:`DROP_BATCH` ids per call."""
        keys = ProductKeys(self._prefix, product_id, bucket)
        due: list[str] = []
        for start in range(0, len(request_ids), DROP_BATCH):
            reply = await self._scripts.run(
                "republish_due",
                keys=[keys.journal, keys.republished],
                args=[int(first_seconds * 1000), int(longest_seconds * 1000), *request_ids[start : start + DROP_BATCH]],
            )
            due.extend(reply)
        return due

    async def realign(
        self,
        product_id: int,
        *,
        mysql_stock: int,
        inventory_version: int,
        terms: SaleTerms,
        resolved: Collection[str] | None,
        kept: Collection[str] = (),
        units_held: Iterable[tuple[str, int]] = (),
        pending: tuple[int, int] = (0, 0),
        dry_run: bool,
        server: str = "",
        marker: str = "keep",
        bucket: int = 0,
        pass_no: int = 0,
    ) -> RealignResult | None:
        """``lua/realign.lua``, atomically against the journal as it is now: stock =
        ``mysql_stock`` - units of journal entries not resolved in the snapshot; sale terms =
        ``terms``. Writes nothing when ``dry_run`` or when Redis already reflects an inventory
        version newer than ``inventory_version`` (``stale``). ``marker``: ``database`` writes the
        stock-mode marker (see :meth:`mark_moved`), ``open`` removes it in the same atomic write
        (the switch to redis mode), ``keep`` leaves it.

        ``resolved`` None: the incremental form, O(1): the resolved entries were already dropped
        (:meth:`drop_resolved`; in a dry run ``pending`` = (entries, units) still in the journal
        though resolved); returns None when the stock or the units counter is missing (Redis lost
        data) or the bucket was loaded in another life of the server: run the full form. Else
        the full form: walks the journal, drops the entries whose
        request id is in ``resolved`` (those in ``kept``, resolved as well, stay in the journal
        without counting as in flight), rebuilds per-user quotas = ``units_held`` (user id, units
        held in MySQL) + units still in the journal, and sets the units counter.

        ``pass_no`` > 0 (a bucket of a product of several, :meth:`.buckets.StockBuckets.next_pass`):
        the write drains the ``bucket`` instead (stock 0 until :meth:`.buckets.StockBuckets.fill`),
        and is ``stale`` too when a newer pass drained it; ``in_flight_units`` is the bucket's,
        for the caller to sum.

        ``server``: the run id :meth:`journal_size` answered with; a write on a server restarted
        since returns None (run the full form, after giving the replay records back). The full
        form records the server's run id in the sale terms: ``lua/reserve.lua`` sells only while
        it is the server's own."""
        keys = ProductKeys(self._prefix, product_id, bucket)
        if resolved is None:
            tail: list[str | int] = [-1, pending[1], pending[0]]
        else:
            pairs = (str(value) for pair in units_held for value in pair)
            tail = [len(resolved), *resolved, len(kept), *kept, *pairs]
        reply = await self._scripts.run(
            "realign",
            keys=[
                keys.stock,
                keys.journal,
                keys.quota,
                keys.versions,
                keys.sale,
                keys.units,
                keys.republished,
                keys.room,
            ],
            args=[
                mysql_stock,
                "0" if dry_run else server,
                inventory_version,
                *terms,
                marker,
                self._restocks.name,
                product_id,
                pass_no,
                *tail,
            ],
        )
        if reply == ["full"]:
            return None
        result = parse_realign_reply(reply)
        if not dry_run and not result.stale:
            self._restocks.announce(product_id)
        return result
