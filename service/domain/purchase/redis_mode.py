"""A purchase in stock mode ``redis`` (docs/ARCHITECTURE.md, "Purchase path"), in four steps:

1. reserve: an order number, then one Lua call (``lua/reserve.lua``) that checks and takes the
   stock; a sold-out bucket of a product of several asks the other buckets;
2. check: the outcome decides (a replay answers the earlier order; a rejection is raised; a
   bucket count, a stock mode or a product Redis does not know sends the purchase on);
3. queue: publish the order with confirm (publish mode ``confirm``) or hand it to the background
   publisher (``async``), a failed publish giving the reservation back;
4. mark queued: the replay record and the order's Redis view say ``queued``. In publish mode
   ``confirm`` the publisher runs this step once the broker confirmed, for every order of the
   confirmed group in one Redis call, before the purchase's wait for the confirm ends: one wait
   (and one resumption of the request) for both, and the answer still follows both.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable

import structlog

from db.models import StockMode
from service import metrics
from service.adapters.background_publisher import BackgroundPublisher
from service.adapters.broker import Publisher
from service.adapters.redis.reservations import new_attempt
from service.adapters.redis.stores import RedisStores
from service.domain.errors import InvalidInput
from service.domain.order_numbers.minter import OrderNumberMinter
from service.domain.purchase.answers import OVER_LIMIT, Accepted, Down, PurchaseRejected, rejected
from service.domain.purchase.buying import Purchase, TryNext, candidate_order_no
from service.domain.purchase.product_modes import ProductModes
from service.domain.purchase.sold_out import SoldOutFlags, Token
from service.failures import PublishFailed, StoreFailure
from service.model.order_message import OrderMessage
from service.model.stock import ReleaseOutcome, Reservation, ReserveOutcome

log = structlog.get_logger(__name__)


@dataclasses.dataclass(frozen=True, slots=True)
class _Reserved:
    """What the reserve step got: the candidate order number, the attempt's token, Redis's
    answer, and for a sold-out bucket of a product of several the units its buckets hold in all
    (None otherwise)."""

    candidate: str
    attempt: str
    reservation: Reservation
    others: int | None


class RedisMode:
    """Purchases of products in stock mode ``redis``, for one process (the collaborators are
    :class:`~service.domain.purchase.service.PurchaseService`'s)."""

    def __init__(
        self,
        store: RedisStores,
        minter: OrderNumberMinter,
        publisher: Publisher,
        modes: ProductModes,
        background: BackgroundPublisher | None,
        sold_out: SoldOutFlags | None,
        not_loaded: Callable[[int], None] | None,
        rebalance: Callable[[int, tuple[int, int]], Awaitable[None]] | None,
    ) -> None:
        self._store = store
        self._minter = minter
        self._publisher = publisher
        self._modes = modes
        self._background = background
        self._sold_out = sold_out
        self._not_loaded = not_loaded
        self._rebalance = rebalance

    async def buy(self, purchase: Purchase, flag: Token | None, moved: bool, retried: bool) -> Accepted | TryNext:
        """Reserve, check, queue, mark queued (the module docstring). ``flag``: the sold-out flag
        state taken before asking Redis. ``moved``: MySQL already said the product is in
        ``redis`` mode (a second ``moved`` then means the switch is under way). ``retried``:
        this is the one retry after a ``rebucket`` answer or a rebalancing of the product's
        buckets. Returns the order, or where to try next.

        Raises:
            PurchaseRejected: a rejection, or ``unavailable`` (any reservation made was given back).
            InvalidInput: ``quantity`` above the product's per-user limit.
        """
        reserved = await self._reserve(purchase, moved)
        if isinstance(reserved, TryNext):
            return reserved
        if reserved.others is not None and reserved.others >= purchase.quantity:
            return await self._rebalanced(purchase, reserved.candidate, retried)
        decided = await self._check(purchase, reserved, flag, moved, retried)
        if decided is not None:
            return decided
        return await self._queue(purchase, reserved)

    async def _reserve(self, purchase: Purchase, moved: bool) -> _Reserved | TryNext:
        """An order number and the reserve call; where to try next when Redis failed."""
        try:
            candidate = await candidate_order_no(self._minter, Down.STOCK)
        except PurchaseRejected as exc:
            return await self._redis_failed(purchase, moved, exc)
        # This HTTP attempt's token: a release names it, so it gives back only what this attempt
        # reserved (never the confirmed original of a retry, nor a concurrent attempt's).
        attempt = new_attempt()
        try:
            reservation = await self._store.reservations.reserve(purchase.reserve_request(candidate, attempt))
            others = None
            if reservation.outcome is ReserveOutcome.SOLD_OUT and purchase.buckets > 1:
                others = await self._other_buckets(purchase)
        except StoreFailure as exc:
            # The script may have run and only its reply been lost, or it may still be on the
            # wire: give back what this attempt holds, or mark it abandoned so it never takes effect.
            log.warning("reserve_failed", request_id=purchase.request_id, error=repr(exc))
            await self._give_back(purchase, attempt)
            return await self._redis_failed(purchase, moved, exc)
        return _Reserved(candidate, attempt, reservation, others)

    async def _rebalanced(self, purchase: Purchase, candidate: str, retried: bool) -> TryNext:
        """The buyer's bucket ran dry while other buckets hold enough: spread the stock again so
        that bucket gets what the buyer asks, then try once more."""
        self._minter.give_back(candidate)
        if retried or self._rebalance is None:
            raise rejected(Down.REBALANCING)
        await self._rebalance(purchase.product_id, (purchase.bucket, purchase.quantity))
        return TryNext(StockMode.REDIS)

    async def _check(
        self, purchase: Purchase, reserved: _Reserved, flag: Token | None, moved: bool, retried: bool
    ) -> Accepted | TryNext | None:
        """What the reserve outcome decides: the earlier order (a replay), where to try next, a
        rejection (raised), or None: reserved, go on and queue it."""
        reservation = reserved.reservation
        if reserved.others is not None:  # sold out in every bucket: the flag holds them all
            reservation = dataclasses.replace(reservation, stock=reserved.others)
        outcome = reservation.outcome
        if outcome is ReserveOutcome.SOLD_OUT and self._sold_out is not None and flag is not None:
            self._sold_out.sold_out(
                purchase.product_id, flag, reservation.stock, reservation.per_user_limit, reservation.sale_left_ms
            )
        if reservation.order_no != reserved.candidate and outcome is not ReserveOutcome.NOT_LOADED:
            # A definite answer that did not use the candidate. Not after 'not loaded': Redis
            # lost data, and a number is never reused around a loss (service/domain/order_numbers/minter.py).
            self._minter.give_back(reserved.candidate)
        if outcome is ReserveOutcome.REPLAY:
            return Accepted(reservation.order_no, purchase.request_id, purchase.product_id, purchase.quantity)
        if outcome is ReserveOutcome.REBUCKET and not retried:
            # This process had not met the product's bucket count (K is fixed at creation).
            self._modes.forget(purchase.product_id)
            return TryNext(StockMode.REDIS, purchase=dataclasses.replace(purchase, buckets=reservation.buckets))
        if outcome is ReserveOutcome.OVER_LIMIT:
            raise InvalidInput("quantity", OVER_LIMIT)
        if outcome is ReserveOutcome.RATE_LIMITED:
            wait = -(-reservation.retry_after_ms // 1000)  # whole seconds, rounded up (RFC 9110 Retry-After)
            raise rejected(outcome, retry_after=wait)
        if outcome is ReserveOutcome.MOVED or (outcome is ReserveOutcome.NOT_LOADED and self._modes.reads_mysql):
            if (elsewhere := await self._not_here(purchase.product_id, outcome, moved)) is not None:
                return elsewhere
        if outcome is not ReserveOutcome.RESERVED:
            raise rejected(outcome)
        if reservation.room is not None:
            # A purchase changes what the room's gauges show: they follow Redis's answer here too.
            label = str(purchase.product_id)
            metrics.WAITING_ROOM_OUTSTANDING.labels(label).set(reservation.room[0])
            metrics.WAITING_ROOM_HELD.labels(label).set(reservation.room[1])
        return None

    async def _not_here(self, product_id: int, outcome: ReserveOutcome, moved: bool) -> TryNext | None:
        """Off the hot path: Redis says the product sells from MySQL, or does not know it. MySQL
        is asked again; ``database`` sends the purchase there (unless it came from there), else
        a product MySQL sells through Redis that Redis does not know means Redis lost its state."""
        known = await self._modes.refresh(product_id)
        if known.stock_mode is StockMode.DATABASE and not moved:
            return TryNext(StockMode.DATABASE, known)
        if outcome is ReserveOutcome.NOT_LOADED and self._not_loaded is not None:
            self._not_loaded(product_id)
        return None

    async def _queue(self, purchase: Purchase, reserved: _Reserved) -> Accepted:
        """Publish the reserved order (or hand it to the background publisher), then mark it
        queued; a publish that failed gives the reservation back and answers ``unavailable``."""
        reservation = reserved.reservation
        message = OrderMessage(
            purchase.request_id,
            reservation.order_no,
            purchase.user_id,
            purchase.product_id,
            purchase.quantity,
            reservation.reserved_at_ms,
            reservation.unit_price * purchase.quantity,
            purchase.bucket,
            reserved.attempt,
        )
        accepted = Accepted(reservation.order_no, purchase.request_id, purchase.product_id, purchase.quantity)
        if self._background is not None:
            # The journal entry is the outbox: marked queued first, a retry is answered as a replay.
            await self._mark_queued(message)
            self._background.submit(message)
            return accepted
        try:
            await self._publisher.publish(message, after=self._mark_all_queued)
        except PublishFailed as exc:
            if await self._give_back(purchase, reserved.attempt) is not ReleaseOutcome.CLAIMED:
                raise rejected(Down.QUEUE) from exc
            # A consumer already holds the message: the confirm was lost, the order was not.
            await self._mark_queued(message)
        return accepted

    async def _mark_queued(self, message: OrderMessage) -> None:
        await self._mark_all_queued([message])

    async def _mark_all_queued(self, messages: list[OrderMessage]) -> None:
        """Replay records -> ``queued`` and the orders' Redis views; a Redis failure is logged only."""
        try:
            await self._store.reservations.mark_queued(messages)
        except StoreFailure as exc:
            # The orders are queued all the same; a replay answers 409 until realignment resolves
            # its journal entry, then it is answered as a replay (reserve.lua).
            for message in messages:
                log.warning("mark_queued_failed", request_id=message.request_id, error=repr(exc))

    async def _redis_failed(self, purchase: Purchase, moved: bool, exc: Exception) -> TryNext:
        """Redis failed for a purchase routed to it: the product may have been switched to
        ``database`` since this process learned its mode (the rollback plan, made while Redis
        is down, leaves no marker in Redis), so MySQL is asked again and, if it says
        ``database``, the purchase goes there. Otherwise ``503 unavailable``.

        Raises:
            PurchaseRejected: ``unavailable``.
            ProductNotFound: MySQL has no such product.
        """
        if self._modes.reads_mysql and not moved:
            known = await self._modes.refresh(purchase.product_id)
            if known.stock_mode is StockMode.DATABASE:
                return TryNext(StockMode.DATABASE, known)
        raise rejected(Down.STOCK) from exc

    async def _other_buckets(self, purchase: Purchase) -> int:
        """The buyer's bucket of a product of several answered ``sold_out``, but the product is
        sold out only when every bucket is: the units its buckets hold in all, or the quantity
        asked (as if enough were left) while a rebalancing pass is filling them.

        Raises:
            service.failures.StoreUnavailable: Redis failed.
        """
        states = await self._store.buckets.states(purchase.product_id, purchase.buckets)
        if any(filling for _, filling in states):
            return purchase.quantity
        return sum(stock or 0 for stock, _ in states)

    async def _give_back(self, purchase: Purchase, attempt: str) -> ReleaseOutcome | None:
        """Release the reservation ``attempt`` made for the request; None when Redis failed."""
        try:
            return await self._store.reservations.release(
                purchase.product_id, purchase.request_id, attempt, bucket=purchase.bucket
            )
        except StoreFailure as exc:
            # Whatever this attempt reserved stays in the journal; realignment re-publishes it after
            # the grace period (so an attempt answered 503 can still become an order here: the one
            # case the abandoned mark cannot cover, since it could not be written).
            log.error("release_failed", request_id=purchase.request_id, error=repr(exc))
            return None
