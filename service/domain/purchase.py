"""The purchase path: reserve in Redis (one Lua call), publish with confirm, or give it back
(publish mode ``confirm``); or reserve, mark queued and publish in the background (``async``).

``PurchaseService.purchase`` is the whole hot path; the HTTP controller only authenticates,
validates and maps the outcome to a status code.
"""

from __future__ import annotations

from dataclasses import dataclass

import structlog
from redis.exceptions import RedisError
from sqlalchemy.ext.asyncio import AsyncEngine

from service.adapters.background_publisher import BackgroundPublisher
from service.adapters.broker import OrderMessage, Publisher, PublishFailed
from service.adapters.redis.results import ReleaseOutcome, ReserveOutcome
from service.adapters.redis.stock_store import StockStore, new_attempt
from service.domain.catalog import product_exists
from service.domain.errors import DomainError, InvalidInput, ProductNotFound
from service.domain.order_no import OrderNumberMinter, ShardLost
from service.domain.sold_out import SoldOutFlags, Verdict

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
    ``request_in_progress``, ``idempotency_key_reused``, ``too_many_requests`` (the purchase rate
    of the user or the client address is spent; ``retry_after`` seconds) or ``unavailable``
    (Redis/RabbitMQ failure, or the stock is not loaded yet; ``retry_after`` seconds)."""

    def __init__(self, code: str, detail: str, retry_after: int | None = None) -> None:
        super().__init__(detail, code=code, retry_after=retry_after or (1 if code == "unavailable" else None))


_REJECTIONS = {
    ReserveOutcome.SOLD_OUT: ("sold_out", "No stock left for this product."),
    ReserveOutcome.LIMIT_EXCEEDED: ("limit_exceeded", "This purchase would take you past the per-user limit."),
    ReserveOutcome.SALE_NOT_ACTIVE: ("sale_not_active", "The sale for this product is not open."),
    ReserveOutcome.IN_FLIGHT: ("request_in_progress", "A request with this Idempotency-Key is still being processed."),
    ReserveOutcome.KEY_REUSED: (
        "idempotency_key_reused",
        "This Idempotency-Key was used with a different request body.",
    ),
    ReserveOutcome.NOT_LOADED: ("unavailable", "Stock is not loaded yet, retry shortly."),
    # Only a reserve that arrives after its own attempt was released answers this, and by then
    # nobody waits for its reply; mapped for completeness.
    ReserveOutcome.ABANDONED: ("unavailable", "Stock service unavailable, retry shortly."),
}
"""Reserve outcome -> (error code of the HTTP contract, detail) for every rejection."""
_OVER_LIMIT = "quantity is above the product's per-user limit."


def _flag_answer(verdict: Verdict) -> DomainError:
    """The error a standing sold-out flag answers: the same as ``reserve.lua`` would."""
    if verdict is Verdict.OVER_LIMIT:
        return InvalidInput("quantity", _OVER_LIMIT)
    return PurchaseRejected(*_REJECTIONS[ReserveOutcome.SOLD_OUT])


class PurchaseService:
    """Runs purchases for one process; holds its stock store, minter and publisher.

    With ``background`` (publish mode ``async``) an accepted purchase is answered once it is
    reserved and marked queued in Redis, and published by ``background``; without it (mode
    ``confirm``) only after the broker confirmed.

    ``sold_out``: the process's sold-out flags (None: every request asks Redis).
    """

    def __init__(
        self,
        store: StockStore,
        minter: OrderNumberMinter,
        publisher: Publisher,
        engine: AsyncEngine | None = None,
        background: BackgroundPublisher | None = None,
        sold_out: SoldOutFlags | None = None,
    ) -> None:
        self._store = store
        self._engine = engine
        self._minter = minter
        self._publisher = publisher
        self._background = background
        self._sold_out = sold_out

    def standing_rejection(self, product_id: int, quantity: int) -> DomainError | None:
        """What a standing sold-out flag answers for a request without an Idempotency-Key, or
        None (ask Redis). Returned, not raised: the HTTP edge answers the most frequent outcome
        of a stampede without unwinding an exception through the framework."""
        flags = self._sold_out
        if flags is None or (verdict := flags.verdict(product_id, quantity)) is None:
            return None
        return _flag_answer(verdict)

    async def purchase(
        self, user_id: str, product_id: int, quantity: int, request_id: str, *, keyed: bool = True, client: str = ""
    ) -> Accepted:
        """Reserve ``quantity`` units of ``product_id`` for ``user_id`` and queue the order.

        Returns the accepted order (once the broker confirmed it, or in publish mode ``async``
        once it is reserved and marked queued), or the earlier answer for a replayed request id.
        ``keyed=False`` says ``request_id`` was minted by the server (no Idempotency-Key, so never
        a replay): then a standing sold-out flag may answer without asking Redis. ``client`` is
        the caller's address, for the per-address purchase rate (checked in the reserve call).

        Raises:
            PurchaseRejected: a business rejection (nothing was written) or ``unavailable``
                (Redis/RabbitMQ failure; any reservation made was given back).
            InvalidInput: ``quantity`` above the product's per-user limit.
            ProductNotFound: Redis does not know the product and MySQL has no such product.
        """
        flags = self._sold_out
        if flags is not None:
            if not keyed and (answer := self.standing_rejection(product_id, quantity)) is not None:
                raise answer
            token = flags.token(product_id)
        try:
            candidate = await self._minter.take()
        except (RedisError, ShardLost, OSError) as exc:
            log.warning("order_no_unavailable", error=repr(exc))
            raise PurchaseRejected("unavailable", "Stock service unavailable, retry shortly.") from exc
        # This HTTP attempt's token: a release names it, so it gives back only what this attempt
        # reserved (never the confirmed original of a retry, nor a concurrent attempt's).
        attempt = new_attempt()
        try:
            reservation = await self._store.reserve(
                product_id, request_id, user_id, quantity, candidate, attempt, client
            )
        except (RedisError, OSError) as exc:
            # The script may have run and only its reply been lost, or it may still be on the
            # wire: give back what this attempt holds, or mark it abandoned so it never takes effect.
            log.warning("reserve_failed", request_id=request_id, error=repr(exc))
            await self._give_back(product_id, request_id, attempt)
            raise PurchaseRejected("unavailable", "Stock service unavailable, retry shortly.") from exc
        if flags is not None and reservation.outcome is ReserveOutcome.SOLD_OUT:
            flags.sold_out(product_id, token, reservation.stock, reservation.per_user_limit, reservation.sale_left_ms)
        order_no = reservation.order_no
        if order_no != candidate:
            self._minter.give_back(candidate)
        accepted = Accepted(order_no, request_id, product_id, quantity)
        outcome = reservation.outcome
        if outcome is ReserveOutcome.REPLAY:
            return accepted
        if outcome is ReserveOutcome.OVER_LIMIT:
            raise InvalidInput("quantity", _OVER_LIMIT)
        if outcome is ReserveOutcome.RATE_LIMITED:
            wait = -(-reservation.retry_after_ms // 1000)  # whole seconds, rounded up (RFC 9110 Retry-After)
            raise PurchaseRejected("too_many_requests", "Too many purchase requests; retry later.", retry_after=wait)
        if outcome is ReserveOutcome.NOT_LOADED and self._engine is not None:
            # Off the hot path: only a product Redis does not know costs a MySQL look-up.
            if not await product_exists(self._engine, product_id):
                raise ProductNotFound(product_id)
        if outcome is not ReserveOutcome.RESERVED:
            raise PurchaseRejected(*_REJECTIONS[outcome])

        message = OrderMessage(
            request_id,
            order_no,
            user_id,
            product_id,
            quantity,
            reservation.reserved_at_ms,
            reservation.unit_price * quantity,
        )
        if self._background is not None:
            # The journal entry is the outbox: marked queued first, a retry is answered as a replay.
            await self._mark_queued(message)
            self._background.submit(message)
            return accepted
        try:
            await self._publisher.publish(message)
        except PublishFailed as exc:
            if await self._give_back(product_id, request_id, attempt) is not ReleaseOutcome.CLAIMED:
                raise PurchaseRejected("unavailable", "Order queue unavailable, retry shortly.") from exc
            # A consumer already holds the message: the confirm was lost, the order was not.
        await self._mark_queued(message)
        return accepted

    async def _mark_queued(self, message: OrderMessage) -> None:
        """Replay record -> ``queued`` and the order's Redis view; a Redis failure is logged only."""
        try:
            await self._store.mark_queued(
                message.product_id, message.request_id, message.order_no, message.user_id, message.quantity
            )
        except (RedisError, OSError) as exc:
            # The order is queued all the same; a replay answers 409 until realignment resolves
            # its journal entry, then it is answered as a replay (reserve.lua).
            log.warning("mark_queued_failed", request_id=message.request_id, error=repr(exc))

    async def _give_back(self, product_id: int, request_id: str, attempt: str) -> ReleaseOutcome | None:
        """Release the reservation ``attempt`` made for ``request_id``; None when Redis failed."""
        try:
            return await self._store.release(product_id, request_id, attempt)
        except (RedisError, OSError) as exc:
            # Whatever this attempt reserved stays in the journal; realignment re-publishes it after
            # the grace period (so an attempt answered 503 can still become an order here: the one
            # case the abandoned mark cannot cover, since it could not be written).
            log.error("release_failed", request_id=request_id, error=repr(exc))
            return None
