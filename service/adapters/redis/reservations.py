"""Reservations: the purchase path's reserve and release, the broker's confirmation
(``mark_queued``), the consumer's claim, a return's restock, and a dead letter's purge.

Every key of one call on a product shares the hash tag of the product's stock bucket
(:class:`~service.adapters.redis.keys.ProductKeys`), so the scripts run on Redis Cluster.
Failures raise :class:`~service.failures.StoreUnavailable` ``("redis")`` only
(:mod:`.boundary`). The scripts that put stock back PUBLISH on the restock channel themselves;
this process's own listeners are told here (:class:`.restock_channel.RestockChannel`).
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from time import perf_counter
from typing import Any, cast

from service import metrics
from service.adapters.redis.batcher import CommandBatcher
from service.adapters.redis.boundary import translated
from service.adapters.redis.client import RedisClient
from service.adapters.redis.keys import ProductKeys, order_key
from service.adapters.redis.replies import format_queued_order, parse_queued_order, parse_reservation
from service.adapters.redis.restock_channel import RestockChannel
from service.adapters.redis.scripts import Scripts
from service.model.order_message import OrderMessage
from service.model.stock import (
    ClaimOutcome,
    QueuedOrder,
    ReleaseOutcome,
    Reservation,
    ReserveRequest,
    RestockOutcome,
)

ATTEMPT_TOKEN_BYTES = 8
"""Random bytes of an attempt token (:func:`new_attempt`): 64 bits, hex-encoded."""
RETURNED_MARKER_TTL_SECONDS = 7 * 86_400
"""Lifetime of the marker that an order's returned units reached Redis (restock runs once)."""

_RESERVE_SECONDS = metrics.local_histogram(metrics.REDIS_SCRIPT_SECONDS, "reserve")
_RELEASE_SECONDS = metrics.local_histogram(metrics.REDIS_SCRIPT_SECONDS, "release")


def new_attempt() -> str:
    """A token unique to one HTTP attempt of a purchase (16 lowercase hex): what
    :meth:`Reservations.reserve` records and :meth:`Reservations.release` must name to give that
    attempt's reservation back. Random, not the candidate order number: a candidate the reserve
    did not use goes back to the minter and may be handed to another attempt of the same request id."""
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

    def script_args(self) -> tuple[int, int, int, int]:
        """The four ARGV of ``lua/reserve.lua`` for these limits: emission interval (ms, 0: no
        limit) and burst, for users then addresses."""
        return (
            _interval_ms(self.user_per_second),
            self.user_burst,
            _interval_ms(self.address_per_second),
            self.address_burst,
        )


def _interval_ms(per_second: float) -> int:
    """The GCRA emission interval for ``per_second`` requests a second (0: no limit)."""
    return max(1, round(1000 / per_second)) if per_second > 0 else 0


class Reservations:
    """Reservations of one key prefix. ``replay_ttl_seconds`` is how long a replay record and a
    queued order's view live."""

    def __init__(
        self,
        redis: RedisClient,
        scripts: Scripts,
        batcher: CommandBatcher,
        restocks: RestockChannel,
        key_prefix: str,
        *,
        replay_ttl_seconds: int = 86_400,
        returned_marker_ttl_seconds: int = RETURNED_MARKER_TTL_SECONDS,
        rate_limits: RateLimits | None = None,
    ) -> None:
        self._redis = redis
        self._scripts = scripts
        self._batcher = batcher
        self._restocks = restocks
        self._prefix = key_prefix
        self._replay_ttl = replay_ttl_seconds
        self._returned_ttl = returned_marker_ttl_seconds
        self._rate_args = (rate_limits or RateLimits()).script_args()

    async def reserve(self, request: ReserveRequest) -> Reservation:
        """``lua/reserve.lua``, one round trip (:class:`ReserveRequest` names what it asks).

        First the purchase rate of the user and of the client address on this product
        (:class:`RateLimits`): ``RATE_LIMITED`` with ``retry_after_ms`` when either is spent.
        Then the replay check for the request id, sale loaded and open, per-user limit and quota,
        numeric stock check; then it decrements the units asked, adds the journal entry (with the
        unit price fixed now) and the replay record (state ``pending``, naming the attempt).
        ``order_no`` is the candidate order number for a new reservation; ``attempt`` a token
        unique to this HTTP attempt (:func:`new_attempt`): the one :meth:`release` needs.
        ``ABANDONED`` when :meth:`release` for that attempt already ran. ``MOVED`` when the
        product sells from MySQL (stock mode ``database``). When the product needs an order
        token, ``order_token`` must be one issued to the user (:class:`.order_tokens.OrderTokens`;
        else ``TOKEN_REQUIRED`` / ``TOKEN_INVALID``); it is deleted in the same call when the
        reservation is made. ``bucket`` is the buyer's among the ``buckets`` the caller believes
        the product has; ``REBUCKET`` (nothing read or spent) names the product's real count. On
        a product with a waiting room, ``admission`` must be the token the room admitted the
        user with, not expired (else ``ADMISSION_REQUIRED``); the reservation consumes it in the
        same call. Only ``RESERVED`` writes stock, quota, journal or replay record. Concurrent
        calls share a pipeline (:class:`CommandBatcher`)."""
        keys = ProductKeys(self._prefix, request.product_id, request.bucket)
        started = perf_counter()
        reply = await self._scripts.run_batched(
            self._batcher,
            "reserve",
            keys=[
                keys.stock,
                keys.sale,
                keys.journal,
                keys.quota,
                keys.replay(request.request_id),
                keys.user_rate(request.user_id),
                keys.address_rate(request.client),
                keys.order_token(request.order_token or ""),
                keys.units,
                keys.room_admitted,
                keys.room_grants,
                keys.room,
                keys.room_due,
            ],
            args=[
                request.request_id,
                request.user_id,
                request.quantity,
                request.order_no,
                self._replay_ttl,
                request.attempt,
                *self._rate_args,
                "0" if request.order_token is None else "1",
                request.buckets,
                request.admission or "",
            ],
        )
        _RESERVE_SECONDS.observe(perf_counter() - started)
        return parse_reservation(reply)

    async def release(self, product_id: int, request_id: str, attempt: str, *, bucket: int = 0) -> ReleaseOutcome:
        """``lua/release.lua``, idempotent: give back the reservation that ``attempt`` made for
        ``request_id`` (stock, per-user quota, journal entry) and leave a ``released`` tombstone
        on its replay record, if it is still ``pending`` and unclaimed. Another attempt's
        reservation, or a ``queued`` one, is never touched. When ``attempt`` holds nothing, it
        is marked abandoned (for ``replay_ttl_seconds`` at least), so its reserve, should it
        reach Redis later, writes nothing. ``bucket``: the buyer's stock bucket."""
        keys = ProductKeys(self._prefix, product_id, bucket)
        started = perf_counter()
        reply = await self._scripts.run(
            "release",
            keys=[keys.stock, keys.journal, keys.quota, keys.replay(request_id), keys.units],
            args=[request_id, self._restocks.name, product_id, attempt, self._replay_ttl],
        )
        _RELEASE_SECONDS.observe(perf_counter() - started)
        outcome = ReleaseOutcome(reply)
        metrics.RELEASES.labels(outcome.value).inc()  # rare: a failed reserve or publish
        if outcome is ReleaseOutcome.RELEASED:
            self._restocks.announce(product_id)
        return outcome

    @translated
    async def mark_queued(self, orders: Sequence[OrderMessage]) -> None:
        """Once the broker confirmed them: each order's replay record's state becomes ``queued``
        and the order's view (read while only Redis knows the order) is written; both live
        ``replay_ttl_seconds``. One round trip for all of them, shared with concurrent calls
        (:class:`CommandBatcher`). Each key is in the slot of the order's stock bucket."""
        commands: list[tuple[Any, ...]] = []
        for order in orders:
            replay = ProductKeys(self._prefix, order.product_id, order.bucket).replay(order.request_id)
            view = format_queued_order(order.user_id, order.product_id, order.request_id, order.quantity)
            commands.append(("HSET", replay, "state", "queued"))
            commands.append(("SET", order_key(self._prefix, order.order_no), view, "EX", self._replay_ttl))
        await self._batcher.call_many(*commands)

    @translated
    async def queued_order(self, order_no: str) -> QueuedOrder | None:
        """The view of an order only Redis knows yet, or None (unknown, written to MySQL long
        ago, or past ``replay_ttl_seconds``)."""
        value = cast(str | None, await self._redis.get(order_key(self._prefix, order_no)))
        return None if value is None else parse_queued_order(order_no, value)

    async def claim(self, product_id: int, request_id: str, attempt: str = "", *, bucket: int = 0) -> ClaimOutcome:
        """:meth:`claim_many` for one message."""
        return (await self.claim_many(product_id, [(request_id, attempt)], bucket=bucket))[0]

    async def claim_many(
        self, product_id: int, messages: Sequence[tuple[str, str]], *, bucket: int = 0
    ) -> list[ClaimOutcome]:
        """``lua/claim.lua``, one round trip for any number of one product's messages, each a
        request id and the attempt token it carries (``""``: unknown): mark each reservation as
        taken by a consumer, so a late release does not give it back. ``RELEASED`` only where
        the replay record is the tombstone of that very attempt. One answer per message, in
        order. Every key lives in the slot of the product's ``bucket`` (the one the reservations
        were made in)."""
        keys = ProductKeys(self._prefix, product_id, bucket)
        reply = await self._scripts.run(
            "claim",
            keys=[keys.journal, *(keys.replay(request_id) for request_id, _ in messages)],
            args=[part for message in messages for part in message],
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
        reply = await self._scripts.run(
            "restock",
            keys=[keys.stock, keys.quota, keys.versions, keys.returned(order_no)],
            args=[
                user_id,
                quantity,
                inventory_version,
                self._returned_ttl,
                "1" if release_quota else "0",
                self._restocks.name,
                product_id,
            ],
        )
        outcome = RestockOutcome(reply)
        if outcome is RestockOutcome.RETURNED:
            self._restocks.announce(product_id)
        return outcome

    async def forget(self, product_id: int, request_id: str, *, bucket: int = 0) -> bool:
        """``lua/purge.lua``: drop ``request_id``'s journal entry and leave a ``released``
        tombstone on its replay record (kept ``replay_ttl_seconds`` at least), for a dead-lettered
        order that MySQL has no row of; its units leave the buyer's quota. Stock is not touched
        here: the realignment pass that must follow recomputes it. True when a journal entry was
        removed. ``bucket``: the buyer's stock bucket."""
        keys = ProductKeys(self._prefix, product_id, bucket)
        reply = await self._scripts.run(
            "purge",
            keys=[keys.journal, keys.replay(request_id), keys.units, keys.republished, keys.quota],
            args=[request_id, self._replay_ttl],
        )
        return bool(reply)
