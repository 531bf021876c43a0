"""The stock store: the one gateway to Redis. It owns every key name and every Lua script.

One method per script or Redis operation, each with a typed answer (:mod:`.results`). Callers
name products, request ids, order numbers and shards; they never build KEYS/ARGV nor know a key.
Every key of one call on a product shares the product's hash tag ``{p:ID}`` (or, for a product
split over stock buckets, the bucket's ``{p:ID:B}``: ``bucket=`` on every per-product method,
:mod:`service.domain.stock.buckets`) and is passed in KEYS, so the scripts run on Redis Cluster.

Errors: every method lets ``redis.exceptions.RedisError`` (and ``OSError`` from the socket)
through; callers decide what a Redis failure means for them (except :meth:`StockStore.follow_restocks`,
which reconnects by itself).

Restock announcements: the scripts that put stock back (``restock``, ``release``, ``realign``)
PUBLISH the product id on the prefix's restock channel, so no caller can forget to; API processes
follow it (:meth:`StockStore.follow_restocks`) to drop their sold-out flags.
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from functools import wraps
from importlib.resources import files
from time import perf_counter
from typing import ParamSpec, TypeVar, cast

import structlog
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError, RedisError

from service import metrics
from service.adapters.redis.batcher import CommandBatcher
from service.adapters.redis.client import RedisClient
from service.adapters.redis.eviction import EvictionPolicy
from service.adapters.redis.keys import (
    ProductKeys,
    epoch_key,
    lock_key,
    order_key,
    restock_channel,
    sequence_key,
    shard_lease_key,
)
from service.adapters.redis.restock_channel import RESUBSCRIBE_SECONDS, follow
from service.adapters.redis.results import (
    ClaimOutcome,
    JournalEntry,
    QueuedOrder,
    RealignResult,
    ReleaseOutcome,
    Reservation,
    RestockOutcome,
    SaleTerms,
    format_queued_order,
    parse_journal_entry,
    parse_queued_order,
    parse_realign_reply,
    parse_reservation,
)
from service.failures import StoreUnavailable

TOKEN_USED = -2
""":meth:`StockStore.take_token`: this user already used the order token (a purchase took it)."""
TOKEN_INVALID = -1
""":meth:`StockStore.take_token`: the order token is unknown, expired or another user's."""
ATTEMPT_TOKEN_BYTES = 8
"""Random bytes of an attempt token (:func:`new_attempt`): 64 bits, hex-encoded."""
SEQUENCE_KEY_TTL_SECONDS = 120
"""Lifetime of an order-number sequence counter (one shard, one second)."""
SCAN_COUNT = 1000
"""Journal entries one HSCAN call asks for (bounded work per Redis call)."""
DROP_BATCH = 500
"""Journal entries one ``realign_drop.lua`` / ``republish_due.lua`` call handles, at most."""
RETURNED_MARKER_TTL_SECONDS = 7 * 86_400
"""Lifetime of the marker that an order's returned units reached Redis (restock runs once)."""

_RESERVE_SECONDS = metrics.local_histogram(metrics.REDIS_SCRIPT_SECONDS, "reserve")
_RELEASE_SECONDS = metrics.local_histogram(metrics.REDIS_SCRIPT_SECONDS, "release")

log = structlog.get_logger(__name__)


def _script(redis: RedisClient, name: str) -> AsyncScript:
    """``lua/<name>.lua`` registered on ``redis`` (EVALSHA, falling back to EVAL once if the
    server lost the script)."""
    return redis.register_script(files("lua").joinpath(f"{name}.lua").read_text(encoding="utf-8"))


def new_attempt() -> str:
    """A token unique to one HTTP attempt of a purchase (16 lowercase hex): what :meth:`StockStore.reserve`
    records and :meth:`StockStore.release` must name to give that attempt's reservation back.
    Random, not the candidate order number: a candidate the reserve did not use goes back to the
    minter and may be handed to another attempt of the same request id."""
    return secrets.token_hex(ATTEMPT_TOKEN_BYTES)


@dataclass(frozen=True, slots=True)
class RateLimits:
    """Purchase requests allowed per product: ``user_per_second`` per user and
    ``address_per_second`` per client address (0: no limit), each with a burst of that many
    requests at once (GCRA in ``lua/reserve.lua``, shared by every API process through Redis)."""

    user_per_second: float = 0.0
    user_burst: int = 1
    address_per_second: float = 0.0
    address_burst: int = 1


def _interval_ms(per_second: float) -> int:
    """The GCRA emission interval for ``per_second`` requests a second (0: no limit)."""
    return max(1, round(1000 / per_second)) if per_second > 0 else 0


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _unavailable(method: Callable[_P, Awaitable[_R]]) -> Callable[_P, Awaitable[_R]]:
    """Until the Redis adapter translates every method (docs/ARCHITECTURE.md, "Failure
    vocabulary"): the purchase path's calls raise :class:`StoreUnavailable` ``("redis")`` for
    any redis-py error."""

    @wraps(method)
    async def translated(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return await method(*args, **kwargs)
        except RedisError as exc:
            raise StoreUnavailable("redis", str(exc).splitlines()[0][:200] if str(exc) else repr(exc)) from exc

    return translated


class StockStore:
    """Stock, reservations, per-user quotas, replay records, order views, order-number sequences
    and shard leases in Redis, for one key prefix.

    ``redis`` must decode responses (``decode_responses=True``). ``replay_ttl_seconds`` is how
    long a replay record and a queued order's view live. Construct one store per client at
    start-up (it registers the scripts on the client), then call :meth:`load` once.
    """

    def __init__(
        self,
        redis: RedisClient,
        key_prefix: str,
        *,
        replay_ttl_seconds: int = 86_400,
        returned_marker_ttl_seconds: int = RETURNED_MARKER_TTL_SECONDS,
        rate_limits: RateLimits | None = None,
    ) -> None:
        self._redis = redis
        limits = rate_limits or RateLimits()
        self._rate_args = (
            _interval_ms(limits.user_per_second),
            limits.user_burst,
            _interval_ms(limits.address_per_second),
            limits.address_burst,
        )
        self._prefix = key_prefix
        self._replay_ttl = replay_ttl_seconds
        self._returned_ttl = returned_marker_ttl_seconds
        self._batcher = CommandBatcher(redis)
        self._channel = restock_channel(key_prefix)
        self._restock_listeners: list[Callable[[int], None]] = []
        self._reserve = _script(redis, "reserve")
        self._release = _script(redis, "release")
        self._claim = _script(redis, "claim")
        self._realign = _script(redis, "realign")
        self._restock = _script(redis, "restock")
        self._lease_renew = _script(redis, "lease_renew")
        self._lease_release = _script(redis, "lease_release")
        self._take_token = _script(redis, "take_token")
        self._purge = _script(redis, "purge")
        self._realign_drop = _script(redis, "realign_drop")
        self._republish_due = _script(redis, "republish_due")
        self._mint = _script(redis, "mint")
        self._epoch = _script(redis, "epoch")
        self._restore_replays = _script(redis, "restore_replays")
        self._bucket_fill = _script(redis, "bucket_fill")
        self._scripts = (
            self._reserve,
            self._release,
            self._claim,
            self._realign,
            self._restock,
            self._lease_renew,
            self._lease_release,
            self._take_token,
            self._purge,
            self._realign_drop,
            self._republish_due,
            self._mint,
            self._epoch,
            self._restore_replays,
            self._bucket_fill,
        )

    # -- set-up and health ---------------------------------------------------------------------

    async def load(self) -> None:
        """SCRIPT LOAD every script, so the first EVALSHA of the hot path does not miss."""
        for script in self._scripts:
            await script.registered_client.script_load(script.script)

    async def ready(self) -> bool:
        """True when the server holds every script: one SCRIPT EXISTS round trip, then SCRIPT
        LOAD (idempotent) of any script the server lost (restart, failover, SCRIPT FLUSH), so a
        probe recovers by itself instead of waiting for each script's next call.

        Raises: as every method, when Redis fails.
        """
        held = await self._redis.script_exists(*(script.sha for script in self._scripts))
        for script, present in zip(self._scripts, held, strict=True):
            if not present:
                log.info("redis_script_reloaded", sha=script.sha)
                await self._redis.script_load(script.script)
        return True

    async def ping(self) -> bool:
        """True when Redis answers PING."""
        return bool(await self._redis.ping())

    def eviction_policy(self) -> EvictionPolicy:
        """A reader of this Redis's ``maxmemory-policy`` (readiness: :mod:`.eviction`)."""
        return EvictionPolicy(self._redis)

    async def aclose(self) -> None:
        """Close the client the store was given (and its connection pool) and the hot path's
        own connection (:class:`CommandBatcher`)."""
        await self._batcher.aclose()
        await self._redis.aclose()

    # -- key names (for tests that inspect Redis state) --------------------------------------

    def product_keys(self, product_id: int, bucket: int = 0) -> ProductKeys:
        """The key names of one product's ``bucket`` (stock, sale, journal, quota, versions, replay, returned)."""
        return ProductKeys(self._prefix, product_id, bucket)

    def sequence_key(self, shard: int, second: str) -> str:
        """The order-number sequence counter of ``shard`` in UTC ``second`` (``yyyyMMddHHmmss``)."""
        return sequence_key(self._prefix, shard, second)

    # -- the purchase path ---------------------------------------------------------------------

    @_unavailable
    async def reserve(
        self,
        product_id: int,
        request_id: str,
        user_id: str,
        quantity: int,
        order_no: str,
        attempt: str,
        order_token: str | None = None,
        client: str = "",
        *,
        bucket: int = 0,
        buckets: int = 1,
    ) -> Reservation:
        """``lua/reserve.lua``, one round trip: replay check for ``request_id``, sale loaded and
        open, per-user limit and quota, numeric stock check, then decrement ``quantity`` units,
        add the journal entry (with the unit price fixed now) and the replay record (state
        ``pending``, naming ``attempt``). ``order_no`` is the candidate order number for a new
        reservation; ``attempt`` a token unique to this HTTP attempt (:func:`new_attempt`): the
        one :meth:`release` needs. ``ABANDONED`` when :meth:`release` for ``attempt`` already
        ran. First, in the same call, the purchase rate of ``user_id`` and of the ``client``
        address on this product (:class:`RateLimits`): ``RATE_LIMITED`` with ``retry_after_ms``
        when either is spent. ``MOVED`` when the product sells from MySQL (stock mode
        ``database``). When the product needs an order token, ``order_token`` must be one
        :meth:`issue_token` gave ``user_id`` (``TOKEN_REQUIRED`` / ``TOKEN_INVALID``); it is deleted
        in the same call when the reservation is made. Only ``RESERVED`` writes stock, quota,
        journal or replay record. Concurrent calls share a pipeline (:class:`CommandBatcher`).
        ``bucket`` is the buyer's among the ``buckets`` the caller believes the product has;
        ``REBUCKET`` (nothing read or spent) names the product's real count."""
        keys = ProductKeys(self._prefix, product_id, bucket)
        command = (
            "EVALSHA",
            self._reserve.sha,
            9,
            keys.stock,
            keys.sale,
            keys.journal,
            keys.quota,
            keys.replay(request_id),
            keys.user_rate(user_id),
            keys.address_rate(client),
            keys.order_token(order_token or ""),
            keys.units,
            request_id,
            user_id,
            quantity,
            order_no,
            self._replay_ttl,
            attempt,
            *self._rate_args,
            "0" if order_token is None else "1",
            buckets,
        )
        started = perf_counter()
        try:
            reply = await self._batcher.call(*command)
        except NoScriptError:  # the server lost its scripts (restart, SCRIPT FLUSH): load, once more
            await self._reserve.registered_client.script_load(self._reserve.script)
            reply = await self._batcher.call(*command)
        _RESERVE_SECONDS.observe(perf_counter() - started)
        return parse_reservation(reply)

    @_unavailable
    async def release(self, product_id: int, request_id: str, attempt: str, *, bucket: int = 0) -> ReleaseOutcome:
        """``lua/release.lua``, idempotent: give back the reservation that ``attempt`` made for
        ``request_id`` (stock, per-user quota, journal entry) and leave a ``released`` tombstone
        on its replay record, if it is still ``pending`` and unclaimed. Another attempt's
        reservation, or a ``queued`` one, is never touched. When ``attempt`` holds nothing, it
        is marked abandoned (for ``replay_ttl_seconds`` at least), so its reserve, should it
        reach Redis later, writes nothing. ``bucket``: the buyer's stock bucket."""
        keys = ProductKeys(self._prefix, product_id, bucket)
        started = perf_counter()
        reply = await self._release(
            keys=[keys.stock, keys.journal, keys.quota, keys.replay(request_id), keys.units],
            args=[request_id, self._channel, product_id, attempt, self._replay_ttl],
        )
        _RELEASE_SECONDS.observe(perf_counter() - started)
        outcome = ReleaseOutcome(reply)
        metrics.RELEASES.labels(outcome.value).inc()  # rare: a failed reserve or publish
        if outcome is ReleaseOutcome.RELEASED:
            self._announce(product_id)
        return outcome

    @_unavailable
    async def mark_queued(
        self, product_id: int, request_id: str, order_no: str, user_id: str, quantity: int, *, bucket: int = 0
    ) -> None:
        """Once the broker confirmed: the replay record's state becomes ``queued`` and the
        order's view (read while only Redis knows the order) is written; both live
        ``replay_ttl_seconds``. One round trip, shared with concurrent calls (:class:`CommandBatcher`).
        ``bucket``: the buyer's stock bucket."""
        await self._batcher.call_many(
            ("HSET", ProductKeys(self._prefix, product_id, bucket).replay(request_id), "state", "queued"),
            (
                "SET",
                order_key(self._prefix, order_no),
                format_queued_order(user_id, product_id, request_id, quantity),
                "EX",
                self._replay_ttl,
            ),
        )

    # -- order tokens and stock modes -------------------------------------------------------

    @_unavailable
    async def issue_token(
        self, product_id: int, token: str, user_id: str, ttl_seconds: int, *, bucket: int = 0
    ) -> None:
        """Keep order token ``token`` for ``user_id`` in the slot of the product's ``bucket`` (the
        buyer's) for ``ttl_seconds`` (seed "order system database design": ``SET token EX 300``
        when the order page opens)."""
        key = ProductKeys(self._prefix, product_id, bucket).order_token(token)
        await self._redis.set(key, user_id, ex=ttl_seconds)

    @_unavailable
    async def take_token(self, product_id: int, token: str, user_id: str, *, bucket: int = 0) -> int:
        """``lua/take_token.lua``: mark ``token`` used if it is ``user_id``'s. Returns the
        milliseconds it had left (>= 1, for :meth:`give_token`), :data:`TOKEN_USED` when this
        user already used it, :data:`TOKEN_INVALID` when it is unknown, expired or another
        user's (nothing written)."""
        key = ProductKeys(self._prefix, product_id, bucket).order_token(token)
        return int(await self._take_token(keys=[key], args=[user_id]))

    @_unavailable
    async def give_token(self, product_id: int, token: str, user_id: str, left_ms: int, *, bucket: int = 0) -> None:
        """Put back a token :meth:`take_token` marked used, for the ``left_ms`` it had left (the
        purchase it was taken for did not happen); nothing when it has expired since."""
        key = ProductKeys(self._prefix, product_id, bucket).order_token(token)
        await self._redis.set(key, user_id, px=left_ms, xx=True)

    async def mark_moved(self, product_id: int, *, buckets: int = 1) -> None:
        """Write the stock-mode marker ``mode = database`` into the sale terms of each of the
        product's ``buckets``: from each write on, :meth:`reserve` in that bucket answers
        ``MOVED`` and takes nothing (the first step of a switch to MySQL; one HSET per bucket,
        atomic against every reserve there)."""
        for bucket in range(buckets):
            await self._redis.hset(ProductKeys(self._prefix, product_id, bucket).sale, "mode", "database")

    @_unavailable
    async def mint_block(self, shard: int, generation: int, second: str, count: int) -> int | None:
        """``lua/mint.lua``: INCRBY ``count`` the sequence counter of ``shard`` in UTC ``second``
        (``yyyyMMddHHmmss``) and (re)set its expiry, only while the shard's epoch is
        ``generation`` installed on this Redis server. Returns the new value (the caller owns
        ``value - count + 1 .. value``; 1 is the first), or None when the epoch is gone or was
        installed on another server (FLUSHALL, restart, failover): see :meth:`shard_epoch`."""
        reply = await self._mint(
            keys=[epoch_key(self._prefix, shard), sequence_key(self._prefix, shard, second)],
            args=[generation, count, SEQUENCE_KEY_TTL_SECONDS],
        )
        return int(reply[1]) if reply[0] == "ok" else None

    @_unavailable
    async def shard_epoch(self, shard: int, install: int | None = None) -> tuple[int | None, bool]:
        """``lua/epoch.lua``: the generation ``shard`` mints in (None: none) and whether it was
        installed on this Redis server. With ``install`` (a generation just taken in MySQL),
        installs it first unless the shard already has an epoch of this server."""
        generation, current = await self._epoch(
            keys=[epoch_key(self._prefix, shard)], args=["" if install is None else install]
        )
        return (None if generation == "" else int(generation)), bool(current)

    # -- order-number shard leases -------------------------------------------------------------

    async def acquire_lease(self, shard: int, holder: str, lease_ms: int) -> bool:
        """SET NX PX: True when ``holder`` (a token unique to the process) now holds ``shard``
        for ``lease_ms`` milliseconds, False when someone else holds it."""
        return bool(await self._redis.set(shard_lease_key(self._prefix, shard), holder, nx=True, px=lease_ms))

    async def renew_lease(self, shard: int, holder: str, lease_ms: int) -> bool:
        """``lua/lease_renew.lua``: extend ``holder``'s lease on ``shard`` to ``lease_ms``
        milliseconds from now; False when the lease expired or belongs to someone else."""
        return bool(await self._lease_renew(keys=[shard_lease_key(self._prefix, shard)], args=[holder, lease_ms]))

    async def release_lease(self, shard: int, holder: str) -> bool:
        """``lua/lease_release.lua``: drop ``holder``'s lease on ``shard``; False when not held."""
        return bool(await self._lease_release(keys=[shard_lease_key(self._prefix, shard)], args=[holder]))

    async def leased_shards(self, shards: int) -> int:
        """How many of shards ``0 .. shards - 1`` are leased now: EXISTS of each lease key in one
        pipeline (on a cluster, one round trip per node)."""
        async with self._redis.pipeline(transaction=False) as pipe:
            for shard in range(shards):
                pipe.exists(shard_lease_key(self._prefix, shard))
            return sum(int(found) for found in await pipe.execute())

    async def try_lock(self, name: str, holder: str, lock_ms: int) -> bool:
        """SET NX PX: True when ``holder`` (a token unique to the caller) now holds the lock
        ``name`` of this key prefix for ``lock_ms`` milliseconds, False when someone else does."""
        return bool(await self._redis.set(lock_key(self._prefix, name), holder, nx=True, px=lock_ms))

    async def renew_lock(self, name: str, holder: str, lock_ms: int) -> bool:
        """``lua/lease_renew.lua``: extend ``holder``'s lock ``name`` to ``lock_ms`` milliseconds
        from now; False when it expired or belongs to someone else."""
        return bool(await self._lease_renew(keys=[lock_key(self._prefix, name)], args=[holder, lock_ms]))

    async def unlock(self, name: str, holder: str) -> bool:
        """``lua/lease_release.lua``: drop ``holder``'s lock ``name``; False when not held."""
        return bool(await self._lease_release(keys=[lock_key(self._prefix, name)], args=[holder]))

    # -- restock announcements (the API's sold-out flags) -------------------------------------

    def on_restock(self, listener: Callable[[int], None]) -> None:
        """Call ``listener(product_id)`` whenever a call of *this* store may have put stock of the
        product back (a restock that returned units, a release, a realignment that wrote), before
        that call returns. Other stores and processes learn it from :meth:`follow_restocks`."""
        self._restock_listeners.append(listener)

    def _announce(self, product_id: int) -> None:
        for listener in self._restock_listeners:
            listener(product_id)

    async def follow_restocks(
        self,
        restocked: Callable[[int], None],
        following: Callable[[], None],
        lost: Callable[[], None],
        *,
        resubscribe_seconds: float = RESUBSCRIBE_SECONDS,
    ) -> None:
        """Follow this key prefix's restock channel until cancelled: see
        :func:`~service.adapters.redis.restock_channel.follow`."""
        await follow(self._redis, self._channel, restocked, following, lost, resubscribe_seconds)

    # -- consumers and the order lifecycle -----------------------------------------------------

    async def claim(self, product_id: int, request_id: str, *, bucket: int = 0) -> ClaimOutcome:
        """:meth:`claim_many` for one request id."""
        return (await self.claim_many(product_id, [request_id], bucket=bucket))[0]

    async def claim_many(self, product_id: int, request_ids: Sequence[str], *, bucket: int = 0) -> list[ClaimOutcome]:
        """``lua/claim.lua``, one round trip for any number of one product's reservations: mark
        each of ``request_ids`` as taken by a consumer, so a late release does not give it back.
        One answer per request id, in order. Every key lives in the slot of the product's ``bucket``
        (the one the reservations were made in)."""
        keys = ProductKeys(self._prefix, product_id, bucket)
        reply = await self._claim(
            keys=[keys.journal, *(keys.replay(request_id) for request_id in request_ids)], args=list(request_ids)
        )
        return [ClaimOutcome(status) for status in reply]

    async def restock(
        self,
        product_id: int,
        order_no: str,
        user_id: str,
        quantity: int,
        inventory_version: int,
        *,
        release_quota: bool,
        bucket: int = 0,
    ) -> RestockOutcome:
        """``lua/restock.lua``, exactly once per order: give ``quantity`` units returned in MySQL
        (by the commit that made the inventory row ``inventory_version``) back to Redis stock, and
        with ``release_quota`` the buyer's per-user quota too (a cancel; not a refund), into the
        buyer's stock ``bucket``."""
        keys = ProductKeys(self._prefix, product_id, bucket)
        reply = await self._restock(
            keys=[keys.stock, keys.quota, keys.versions, keys.returned(order_no)],
            args=[
                user_id,
                quantity,
                inventory_version,
                self._returned_ttl,
                "1" if release_quota else "0",
                self._channel,
                product_id,
            ],
        )
        outcome = RestockOutcome(reply)
        if outcome is RestockOutcome.RETURNED:
            self._announce(product_id)
        return outcome

    # -- realignment and reads -----------------------------------------------------------------

    async def journal(self, product_id: int, *, bucket: int = 0) -> list[JournalEntry]:
        """Every reservation in the product's journal, in no particular order: HSCAN, about
        :data:`SCAN_COUNT` entries per call, so no call blocks Redis for long however big the
        journal is (an entry present throughout the scan is returned; one added or removed
        meanwhile may or may not be, and one may come twice: kept once).

        Raises:
            ValueError: an entry of neither journal shape (:func:`.results.parse_journal_entry`).
        """
        entries: dict[str, JournalEntry] = {}
        key = ProductKeys(self._prefix, product_id, bucket).journal
        async for request_id, value in self._redis.hscan_iter(key, count=SCAN_COUNT):
            entries[request_id] = parse_journal_entry(request_id, value)
        return list(entries.values())

    async def restore_replays(
        self, product_id: int, orders: Sequence[tuple[str, str, int, int]], *, bucket: int = 0
    ) -> int:
        """``lua/restore_replays.lua``: the replay record of each order (request id, order number,
        quantity in units, age in seconds of its row) that Redis does not have, as ``queued``,
        living what is left of ``replay_ttl_seconds`` (orders older than that are skipped), in
        calls of at most :data:`SCAN_COUNT` records, in the product's ``bucket`` (the buyers'). Returns
        how many records were written."""
        keys = ProductKeys(self._prefix, product_id, bucket)
        live = [order for order in orders if order[3] < self._replay_ttl]
        written = 0
        for start in range(0, len(live), SCAN_COUNT):
            chunk = live[start : start + SCAN_COUNT]
            args: list[str | int] = []
            for _, order_no, quantity, age in chunk:
                args += [quantity, order_no, self._replay_ttl - age]
            written += int(await self._restore_replays(keys=[keys.replay(order[0]) for order in chunk], args=args))
        return written

    async def journal_size(self, product_id: int, *, bucket: int = 0) -> int | None:
        """Entries in the product's journal (HLEN), or None when the product's stock or its
        journal-units counter is missing from Redis (then only a full realignment pass can
        restore it; else a pass may be incremental: :meth:`drop_resolved`, :meth:`realign`)."""
        keys = ProductKeys(self._prefix, product_id, bucket)
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.exists(keys.stock, keys.units)
            pipe.hlen(keys.journal)
            present, size = await pipe.execute()
        return int(size) if int(present) == 2 else None

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
            dropped, dropped_units = await self._realign_drop(
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
            reply = await self._republish_due(
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
        units_held: Iterable[tuple[str, int]] = (),
        pending: tuple[int, int] = (0, 0),
        dry_run: bool,
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
        data): run the full form. Else the full form: walks the journal, drops the entries whose
        request id is in ``resolved``, rebuilds per-user quotas = ``units_held`` (user id, units
        held in MySQL) + units still in the journal, and sets the units counter.

        ``pass_no`` > 0 (a bucket of a product of several, :meth:`next_pass`): the write drains the
        ``bucket`` instead (stock 0 until :meth:`fill_bucket`), and is ``stale`` too when a newer
        pass drained it; ``in_flight_units`` is the bucket's, for the caller to sum."""
        keys = ProductKeys(self._prefix, product_id, bucket)
        if resolved is None:
            tail: list[str | int] = [-1, pending[1], pending[0]]
        else:
            tail = [len(resolved), *resolved, *(str(value) for pair in units_held for value in pair)]
        reply = await self._realign(
            keys=[keys.stock, keys.journal, keys.quota, keys.versions, keys.sale, keys.units, keys.republished],
            args=[
                mysql_stock,
                "0" if dry_run else "1",
                inventory_version,
                *terms,
                marker,
                self._channel,
                product_id,
                pass_no,
                *tail,
            ],
        )
        if reply == ["full"]:
            return None
        result = parse_realign_reply(reply)
        if not dry_run and not result.stale:
            self._announce(product_id)
        return result

    async def forget_reservation(self, product_id: int, request_id: str, *, bucket: int = 0) -> bool:
        """``lua/purge.lua``: drop ``request_id``'s journal entry and leave a ``released``
        tombstone on its replay record (kept ``replay_ttl_seconds`` at least), for a dead-lettered
        order that MySQL has no row of; its units leave the buyer's quota. Stock is not touched
        here: the realignment pass that must follow recomputes it. True when a journal entry was
        removed. ``bucket``: the buyer's stock bucket."""
        keys = ProductKeys(self._prefix, product_id, bucket)
        reply = await self._purge(
            keys=[keys.journal, keys.replay(request_id), keys.units, keys.republished, keys.quota],
            args=[request_id, self._replay_ttl],
        )
        return bool(reply)

    async def seed_replays(self, product_id: int, orders: list[tuple[str, str, int]], *, bucket: int = 0) -> None:
        """Replay records (state ``queued``) for orders MySQL already holds: ``(request_id,
        order_no, quantity)``, each living ``replay_ttl_seconds``. For a product moving to stock
        mode ``redis``: a retry of a purchase answered in ``database`` mode must be answered as
        its replay (same order number), not taken as a new purchase (IETF Idempotency-Key
        draft). Pipelined, 500 orders per round trip, into the product's ``bucket`` (the buyers')."""
        keys = ProductKeys(self._prefix, product_id, bucket)
        for start in range(0, len(orders), 500):
            async with self._redis.pipeline(transaction=False) as pipe:
                for request_id, order_no, quantity in orders[start : start + 500]:
                    replay = keys.replay(request_id)
                    pipe.hset(replay, mapping={"quantity": quantity, "order_no": order_no, "state": "queued"})
                    pipe.expire(replay, self._replay_ttl)
                await pipe.execute()

    @property
    def replay_ttl_seconds(self) -> int:
        """How long a replay record lives (seconds)."""
        return self._replay_ttl

    async def mark_queued_if_pending(self, product_id: int, request_id: str, *, bucket: int = 0) -> bool:
        """After a re-publish: a replay record still ``pending`` becomes ``queued`` (two round
        trips, not atomic: only realignment calls it). True when it changed the state."""
        replay = ProductKeys(self._prefix, product_id, bucket).replay(request_id)
        if await self._redis.hget(replay, "state") != "pending":
            return False
        await self._redis.hset(replay, "state", "queued")
        return True

    async def server_time_ms(self) -> int:
        """Redis server time in Unix milliseconds (the clock of ``reserved_at_ms``)."""
        seconds, micros = await self._redis.time()
        return int(seconds) * 1000 + int(micros) // 1000

    async def stock(self, product_id: int, *, buckets: int = 1) -> int | None:
        """Units Redis can still sell over the product's ``buckets``, or None when the product
        (any of its buckets) is not loaded."""
        if buckets == 1:
            value = await self._redis.get(ProductKeys(self._prefix, product_id).stock)
            return None if value is None else int(value)
        stocks = [stock for stock, _ in await self.bucket_states(product_id, buckets)]
        return None if None in stocks else sum(cast(list[int], stocks))

    @_unavailable
    async def bucket_states(self, product_id: int, buckets: int) -> list[tuple[int | None, bool]]:
        """Per bucket 0 .. ``buckets`` - 1: (units it can sell or None when not loaded, whether a
        rebalancing pass drained it and has not filled it yet). One pipeline (on a cluster, one
        round trip per node)."""
        async with self._redis.pipeline(transaction=False) as pipe:
            for bucket in range(buckets):
                keys = ProductKeys(self._prefix, product_id, bucket)
                pipe.get(keys.stock)
                pipe.hexists(keys.versions, "filling")
            replies = await pipe.execute()
        return [
            (None if stock is None else int(stock), bool(filling))
            for stock, filling in zip(replies[::2], replies[1::2], strict=True)
        ]

    async def next_pass(self, product_id: int) -> int:
        """A new rebalancing pass number for the product (1, 2, ...: HINCRBY in bucket 0's
        ``versions``), the ``pass_no`` of :meth:`realign` and :meth:`fill_bucket`."""
        return int(await self._redis.hincrby(ProductKeys(self._prefix, product_id).versions, "passes", 1))

    async def fill_bucket(self, product_id: int, bucket: int, pass_no: int, units: int) -> bool:
        """``lua/bucket_fill.lua``: add ``units`` (the bucket's share of a rebalancing pass) to the
        drained ``bucket`` and end its ``filling`` state. False, writing nothing, when a newer
        pass drained the bucket since, or its stock is gone (run a new pass)."""
        keys = ProductKeys(self._prefix, product_id, bucket)
        filled = bool(
            await self._bucket_fill(keys=[keys.stock, keys.versions], args=[pass_no, units, self._channel, product_id])
        )
        if filled and units > 0:
            self._announce(product_id)
        return filled

    async def quota(self, product_id: int, *, buckets: int = 1) -> dict[str, int]:
        """Units each user holds against the per-user limit (users holding none are absent), over
        the product's ``buckets`` (each user's units are in their own bucket)."""
        held: dict[str, int] = {}
        for bucket in range(buckets):
            raw = cast(dict[str, str], await self._redis.hgetall(ProductKeys(self._prefix, product_id, bucket).quota))
            held.update((user_id, int(units)) for user_id, units in raw.items())
        return held

    async def queued_order(self, order_no: str) -> QueuedOrder | None:
        """The view of an order only Redis knows yet, or None (unknown, written to MySQL long
        ago, or past ``replay_ttl_seconds``)."""
        value = cast(str | None, await self._redis.get(order_key(self._prefix, order_no)))
        return None if value is None else parse_queued_order(order_no, value)
