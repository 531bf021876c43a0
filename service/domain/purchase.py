"""The purchase path: reserve in Redis (one Lua call), publish with confirm, or give it back.

``PurchaseService.purchase`` is the whole hot path; the HTTP controller only authenticates,
validates and maps the outcome to a status code.
"""

from __future__ import annotations

from dataclasses import dataclass

import structlog
from redis.asyncio import Redis
from redis.exceptions import RedisError
from sqlalchemy.ext.asyncio import AsyncEngine

from service.adapters.broker import OrderMessage, Publisher, PublishFailed
from service.adapters.redis.keys import ProductKeys, order_key
from service.adapters.redis.scripts import Scripts
from service.domain.catalog import product_exists
from service.domain.errors import DomainError, InvalidInput, ProductNotFound
from service.domain.order_no import OrderNumberMinter, ShardLost
from service.settings import Settings

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class Accepted:
    """A purchase the broker has confirmed (or a replay of one). ``quantity`` in units."""

    order_no: str
    request_id: str
    product_id: int
    quantity: int


class PurchaseRejected(DomainError):
    """The purchase was not taken; nothing stays reserved. ``code`` is the stable error code of
    the HTTP contract: ``sold_out``, ``limit_exceeded``, ``sale_not_active``,
    ``request_in_progress``, ``idempotency_key_reused`` or ``unavailable`` (Redis/RabbitMQ
    failure, or the stock is not loaded yet; ``retry_after`` seconds)."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(detail, code=code, retry_after=1 if code == "unavailable" else None)


_REJECTIONS = {
    "sold_out": "No stock left for this product.",
    "limit_exceeded": "This purchase would take you past the per-user limit.",
    "sale_not_active": "The sale for this product is not open.",
    "in_flight": "A request with this Idempotency-Key is still being processed.",
    "key_reused": "This Idempotency-Key was used with a different request body.",
    "not_loaded": "Stock is not loaded yet, retry shortly.",
}
_CODES = {"in_flight": "request_in_progress", "key_reused": "idempotency_key_reused"}


class PurchaseService:
    """Runs purchases for one process; holds its Redis client, scripts, minter and publisher."""

    def __init__(
        self,
        redis: Redis,
        scripts: Scripts,
        minter: OrderNumberMinter,
        publisher: Publisher,
        settings: Settings,
        engine: AsyncEngine | None = None,
    ) -> None:
        self._engine = engine
        self._redis = redis
        self._scripts = scripts
        self._minter = minter
        self._publisher = publisher
        self._prefix = settings.redis.key_prefix
        self._replay_ttl = settings.orders.replay_ttl_seconds

    async def purchase(self, user_id: str, product_id: int, quantity: int, request_id: str) -> Accepted:
        """Reserve ``quantity`` units of ``product_id`` for ``user_id`` and queue the order.

        Returns the accepted order, or the earlier answer for a replayed request id.

        Raises:
            PurchaseRejected: a business rejection (nothing was written) or ``unavailable``
                (Redis/RabbitMQ failure; any reservation made was given back).
            InvalidInput: ``quantity`` above the product's per-user limit.
            ProductNotFound: Redis does not know the product and MySQL has no such product.
        """
        keys = ProductKeys(self._prefix, product_id)
        try:
            candidate = await self._minter.take()
        except (RedisError, ShardLost, OSError) as exc:
            log.warning("order_no_unavailable", error=repr(exc))
            raise PurchaseRejected("unavailable", "Stock service unavailable, retry shortly.") from exc
        try:
            outcome, order_no, *reserved_at = await self._scripts.reserve(
                keys=[keys.stock, keys.sale, keys.journal, keys.quota, keys.replay(request_id)],
                args=[request_id, user_id, quantity, candidate, self._replay_ttl],
            )
        except (RedisError, OSError) as exc:
            # The script may have run and only its reply been lost: give back what it may hold.
            log.warning("reserve_failed", request_id=request_id, error=repr(exc))
            await self._give_back(keys, request_id)
            raise PurchaseRejected("unavailable", "Stock service unavailable, retry shortly.") from exc
        if order_no != candidate:
            self._minter.give_back(candidate)
        accepted = Accepted(order_no, request_id, product_id, quantity)
        if outcome == "replay":
            return accepted
        if outcome == "over_limit":
            raise InvalidInput("quantity", "quantity is above the product's per-user limit.")
        if outcome == "not_loaded":
            # Off the hot path: only a product Redis does not know costs a MySQL look-up.
            if self._engine is not None and not await product_exists(self._engine, product_id):
                raise ProductNotFound(product_id)
            raise PurchaseRejected("unavailable", _REJECTIONS[outcome])
        if outcome != "reserved":
            raise PurchaseRejected(_CODES.get(outcome, outcome), _REJECTIONS[outcome])

        reserved_at_ms, unit_price = reserved_at
        message = OrderMessage(request_id, order_no, user_id, product_id, quantity, reserved_at_ms, int(unit_price) * quantity)
        try:
            await self._publisher.publish(message)
        except PublishFailed as exc:
            if await self._give_back(keys, request_id) != "claimed":
                raise PurchaseRejected("unavailable", "Order queue unavailable, retry shortly.") from exc
            # A consumer already holds the message: the confirm was lost, the order was not.
        await self._mark_queued(keys, accepted, user_id)
        return accepted

    async def _give_back(self, keys: ProductKeys, request_id: str) -> str:
        try:
            return await self._scripts.release(
                keys=[keys.stock, keys.journal, keys.quota, keys.replay(request_id)], args=[request_id]
            )
        except RedisError as exc:
            # The reservation stays in the journal; realignment re-publishes it after the grace period.
            log.error("release_failed", request_id=request_id, error=repr(exc))
            return "failed"

    async def _mark_queued(self, keys: ProductKeys, accepted: Accepted, user_id: str) -> None:
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.hset(keys.replay(accepted.request_id), "state", "queued")
                pipe.set(
                    order_key(self._prefix, accepted.order_no),
                    f"{user_id}|{accepted.product_id}|{accepted.request_id}|{accepted.quantity}",
                    ex=self._replay_ttl,
                )
                await pipe.execute()
        except RedisError as exc:
            # The order is queued all the same; a replay answers 409 until realignment resolves
            # its journal entry, then it is answered as a replay (reserve.lua).
            log.warning("mark_queued_failed", request_id=accepted.request_id, error=repr(exc))
