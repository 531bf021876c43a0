"""The purchase path, per product stock mode (docs/ARCHITECTURE.md, "How it works"):

- ``redis`` (scheme 2): reserve in Redis (one Lua call), publish with confirm, or give it back
  (publish mode ``confirm``); or reserve, mark queued and publish in the background (``async``).
- ``database`` (scheme 1): one MySQL transaction (:mod:`service.domain.purchase.database`).

``PurchaseService.purchase`` is the whole hot path; the HTTP controller only authenticates,
validates and maps the outcome to a status code.

Which mode a product is in is kept per process (:class:`RouteCache`), learned from MySQL
and corrected by the answers themselves: ``reserve.lua`` answers ``moved`` for a product that
sells from MySQL (a marker in the product's Redis slot, written before MySQL serves), and the
MySQL transaction answers ``MOVED`` for a product that is in ``redis`` mode (read under the
inventory row lock that a switch takes). So no message has to reach the process for a switch to
be safe, the ``redis`` hot path costs neither a MySQL query nor an extra Redis round trip, and a
stale entry costs one bounce.

Stock mode ``database`` needs no Redis (the rollback plan when Redis is lost): its order
numbers come from MySQL (:class:`MysqlOrderNumberMinter`, shards reserved to it), replays are
found by MySQL's unique request id, the mode is read from MySQL, and a product routed to Redis
whose Redis call fails is looked up in MySQL again, so a switch to ``database`` made while Redis
is down takes effect in every process at its next purchase. Only order tokens live in Redis: a
product that requires one answers ``503`` while Redis is down.
"""

from __future__ import annotations

import dataclasses
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import Enum

import structlog
from sqlalchemy.ext.asyncio import AsyncEngine

from db.models import StockMode
from service.adapters.background_publisher import BackgroundPublisher
from service.adapters.broker import OrderMessage, Publisher
from service.adapters.redis.order_tokens import TOKEN_INVALID, TOKEN_USED
from service.adapters.redis.reservations import new_attempt
from service.adapters.redis.stores import RedisStores
from service.domain.errors import DomainError, InvalidInput, ProductNotFound
from service.domain.model.stock import ReleaseOutcome, ReserveOutcome
from service.domain.order_numbers.minter import OrderNumberMinter, ShardLost
from service.domain.order_numbers.mysql_minter import MysqlOrderNumberMinter
from service.domain.purchase.database import (
    DatabaseAnswer,
    DatabasePurchase,
    buy_in_database,
    earlier_order,
    replay_of,
)
from service.domain.purchase.routes import Route, RouteCache
from service.domain.purchase.sold_out import SoldOutFlags, Token, Verdict
from service.domain.stock.buckets import bucket_of
from service.failures import (
    UNAVAILABLE,
    UNAVAILABLE_RETRY_AFTER,
    PublishFailed,
    StoreFailure,
    StoreUnavailable,
    unavailable_detail,
)

log = structlog.get_logger(__name__)

ORDER_TOKEN_BYTES = 24
"""Random bytes of an order token: 192 bits, 32 URL-safe characters."""


@dataclass(frozen=True, slots=True)
class Accepted:
    """A purchase the broker has confirmed (or a replay of one). ``quantity`` in units.
    ``status``: None for an order queued for MySQL (stock mode ``redis``), else the status label
    of the order MySQL already holds (``database`` mode: ``pending_payment`` when new)."""

    order_no: str
    request_id: str
    product_id: int
    quantity: int
    status: str | None = None


class PurchaseRejected(DomainError):
    """The purchase was not taken; nothing stays reserved. ``code`` is the stable error code of
    the HTTP contract: ``sold_out``, ``limit_exceeded``, ``sale_not_active``,
    ``request_in_progress``, ``idempotency_key_reused``, ``too_many_requests`` (the purchase rate
    of the user or the client address is spent; ``retry_after`` seconds) or ``unavailable``
    (Redis/RabbitMQ failure, or the stock is not loaded yet; ``retry_after`` seconds)."""

    def __init__(self, code: str, detail: str, retry_after: int | None = None) -> None:
        default = UNAVAILABLE_RETRY_AFTER if code == UNAVAILABLE else None
        super().__init__(detail, code=code, retry_after=retry_after or default)


class Down(Enum):
    """Why a purchase answers ``unavailable`` when no reserve outcome says it: which store failed
    (or that the buyer's bucket is being refilled)."""

    STOCK = "stock"
    DATABASE = "database"
    QUEUE = "queue"
    TOKENS = "tokens"
    REBALANCING = "rebalancing"


_REJECTIONS: dict[ReserveOutcome | Down, tuple[str, str]] = {
    ReserveOutcome.SOLD_OUT: ("sold_out", "No stock left for this product."),
    ReserveOutcome.LIMIT_EXCEEDED: ("limit_exceeded", "This purchase would take you past the per-user limit."),
    ReserveOutcome.SALE_NOT_ACTIVE: ("sale_not_active", "The sale for this product is not open."),
    ReserveOutcome.IN_FLIGHT: ("request_in_progress", "A request with this Idempotency-Key is still being processed."),
    ReserveOutcome.KEY_REUSED: (
        "idempotency_key_reused",
        "This Idempotency-Key was used with a different request body.",
    ),
    ReserveOutcome.RATE_LIMITED: ("too_many_requests", "Too many purchase requests; retry later."),
    ReserveOutcome.NOT_LOADED: (UNAVAILABLE, "Stock is not loaded yet, retry shortly."),
    ReserveOutcome.TOKEN_REQUIRED: ("token_required", "This product needs an Order-Token header."),
    ReserveOutcome.TOKEN_INVALID: ("token_invalid", "The Order-Token is unknown, expired or not yours."),
    # Both sides said the other serves: the product is being switched between stock modes.
    ReserveOutcome.MOVED: (UNAVAILABLE, "The product is switching stock mode, retry shortly."),
    # Only a reserve that arrives after its own attempt was released answers this, and by then
    # nobody waits for its reply; mapped for completeness.
    ReserveOutcome.ABANDONED: (UNAVAILABLE, unavailable_detail("Stock service")),
    # A second 'rebucket' in a row: the product was set up again meanwhile.
    ReserveOutcome.REBUCKET: (UNAVAILABLE, unavailable_detail("Stock service")),
    Down.STOCK: (UNAVAILABLE, unavailable_detail("Stock service")),
    Down.DATABASE: (UNAVAILABLE, unavailable_detail("Order database")),
    Down.QUEUE: (UNAVAILABLE, unavailable_detail("Order queue")),
    Down.TOKENS: (UNAVAILABLE, unavailable_detail("Token store")),
    Down.REBALANCING: (UNAVAILABLE, "Stock is being rebalanced, retry shortly."),
}
"""Every rejection of the purchase path, in both stock modes: reserve outcome (or why a store
failed) -> (error code of the HTTP contract, detail)."""
_OVER_LIMIT = "quantity is above the product's per-user limit."


def rejected(why: ReserveOutcome | Down, retry_after: int | None = None) -> PurchaseRejected:
    """The rejection ``why`` answers (:data:`_REJECTIONS`)."""
    code, detail = _REJECTIONS[why]
    return PurchaseRejected(code, detail, retry_after)


def _flag_answer(verdict: Verdict) -> DomainError:
    """The error a standing sold-out flag answers: the same as ``reserve.lua`` would."""
    if verdict is Verdict.OVER_LIMIT:
        return InvalidInput("quantity", _OVER_LIMIT)
    return rejected(ReserveOutcome.SOLD_OUT)


@dataclass(frozen=True, slots=True)
class _Ask:
    """One purchase request on its way through either stock mode."""

    user_id: str
    product_id: int
    quantity: int
    request_id: str
    order_token: str | None
    client: str  # the caller's address (per-address purchase rate)
    buckets: int = 1  # the product's stock buckets, as this process knows them

    @property
    def bucket(self) -> int:
        """The buyer's stock bucket (:func:`~service.domain.stock.buckets.bucket_of`)."""
        return bucket_of(self.user_id, self.buckets)


@dataclass(frozen=True, slots=True)
class _Again:
    """A route's answer that is not the purchase's yet: try stock mode ``mode`` next, the other
    route (a move) or the same one once more; ``route``: the ``database`` route to use; ``ask``:
    the request as it goes on (when the product's bucket count was learned)."""

    mode: StockMode
    route: Route | None = None
    ask: _Ask | None = None


class PurchaseService:
    """Runs purchases for one process; holds its stock store, minter and publisher.

    With ``background`` (publish mode ``async``) an accepted purchase is answered once it is
    reserved and marked queued in Redis, and published by ``background``; without it (mode
    ``confirm``) only after the broker confirmed.

    ``sold_out``: the process's sold-out flags (None: every request asks Redis).
    ``engine`` None: every product is taken to be in ``redis`` mode (no MySQL at hand).
    ``token_ttl_seconds``: how long an order token lives.
    ``database_minter``: order numbers of stock mode ``database`` (from MySQL, no Redis); None:
    ``minter``'s (Redis).
    ``not_loaded(product_id)``: told when Redis does not know a product that MySQL sells through
    Redis (Redis lost its state; :meth:`service.domain.stock.recovery.Recovery.not_loaded`).
    ``rebalance(product_id, (bucket, quantity))``: spreads a product's stock over its buckets again,
    that bucket getting at least that quantity where the stock allows
    (:class:`service.domain.stock.rebalance.Rebalancer`), awaited when a buyer's bucket ran dry while
    others hold units; None: such a buyer is answered ``unavailable``.
    """

    def __init__(
        self,
        store: RedisStores,
        minter: OrderNumberMinter,
        publisher: Publisher,
        engine: AsyncEngine | None = None,
        background: BackgroundPublisher | None = None,
        sold_out: SoldOutFlags | None = None,
        token_ttl_seconds: int = 300,
        database_minter: MysqlOrderNumberMinter | None = None,
        not_loaded: Callable[[int], None] | None = None,
        rebalance: Callable[[int, tuple[int, int]], Awaitable[None]] | None = None,
    ) -> None:
        self._store = store
        self._engine = engine
        self._minter = minter
        self._database_minter: OrderNumberMinter | MysqlOrderNumberMinter = database_minter or minter
        self._publisher = publisher
        self._background = background
        self._sold_out = sold_out
        self._routes = RouteCache(engine)
        self.token_ttl_seconds = token_ttl_seconds
        self._not_loaded = not_loaded
        self._rebalance = rebalance

    def standing_rejection(self, product_id: int, quantity: int) -> DomainError | None:
        """What a standing sold-out flag answers for a request without an Idempotency-Key, or
        None (ask Redis). Returned, not raised: the HTTP edge answers the most frequent outcome
        of a stampede without unwinding an exception through the framework."""
        flags = self._sold_out
        if flags is None or (verdict := flags.verdict(product_id, quantity)) is None:
            return None
        return _flag_answer(verdict)

    async def purchase(
        self,
        user_id: str,
        product_id: int,
        quantity: int,
        request_id: str,
        *,
        keyed: bool = True,
        order_token: str | None = None,
        client: str = "",
    ) -> Accepted:
        """Buy ``quantity`` units of ``product_id`` for ``user_id`` in the product's stock mode.

        ``redis``: reserve and queue the order; returns it once the broker confirmed it (or in
        publish mode ``async`` once it is reserved and marked queued). ``database``: write it in
        one MySQL transaction; returns it ``pending_payment`` (``status`` set). Either way the
        earlier answer for a replayed request id. ``keyed=False`` says ``request_id`` was minted
        by the server (no Idempotency-Key, so never a replay): then a standing sold-out flag may
        answer without asking Redis. ``order_token``: the ``Order-Token`` header (the request id
        derives from it); consumed by the purchase it makes. ``client`` is the caller's address,
        for the per-address purchase rate (checked in the reserve call; stock mode ``redis`` only).

        Raises:
            PurchaseRejected: a business rejection (nothing was written) or ``unavailable``
                (Redis/RabbitMQ/MySQL failure; any reservation made was given back).
            InvalidInput: ``quantity`` above the product's per-user limit.
            ProductNotFound: neither Redis nor MySQL knows the product.
        """
        flags = self._sold_out
        token: Token | None = None
        if flags is not None:
            if not keyed and (answer := self.standing_rejection(product_id, quantity)) is not None:
                raise answer
            token = flags.token(product_id)
        route = self._routes.cached(product_id) or await self._routes.load(product_id)
        ask = _Ask(user_id, product_id, quantity, request_id, order_token, client, route.buckets)
        # At most two routes (one move: both sides saying "the other one" means a switch is under
        # way), each tried at most twice (a rebucket, a rebalancing or a token requirement learned).
        step = _Again(route.mode, route)
        moved = retried = False
        for _ in range(4):
            if step.mode is StockMode.DATABASE:
                assert step.route is not None
                result = await self._in_database(ask, step.route, moved)
            else:
                result = await self._in_redis(ask, token, moved, retried)
            if isinstance(result, Accepted):
                return result
            if result.mode is step.mode:
                retried = True
            else:
                moved, retried, token = True, False, None
            ask, step = result.ask or ask, result
        raise AssertionError("a purchase took more than two routes, twice each")

    async def issue_token(self, user_id: str, product_id: int) -> str:
        """A new order token for ``user_id`` and ``product_id`` (32 URL-safe characters), kept in
        the product's Redis slot for ``token_ttl_seconds`` (the anti-duplicate token issued when
        the order page opens).

        Raises:
            ProductNotFound: MySQL has no such product.
            PurchaseRejected: ``unavailable`` (Redis failed).
        """
        route = await self._routes.route(product_id)
        token = secrets.token_urlsafe(ORDER_TOKEN_BYTES)
        bucket = bucket_of(user_id, route.buckets)
        try:
            await self._store.tokens.issue(product_id, token, user_id, self.token_ttl_seconds, bucket=bucket)
        except (StoreUnavailable, OSError) as exc:
            raise rejected(Down.STOCK) from exc
        return token

    async def _mint(self) -> str:
        try:
            return await self._minter.take()
        except (StoreUnavailable, ShardLost, OSError) as exc:
            log.warning("order_no_unavailable", error=repr(exc))
            raise rejected(Down.STOCK) from exc

    async def _mint_for_database(self) -> str:
        try:
            return await self._database_minter.take()
        except (StoreFailure, ShardLost, OSError) as exc:
            log.warning("order_no_unavailable", error=repr(exc))
            raise rejected(Down.DATABASE) from exc

    async def _redis_failed(self, ask: _Ask, moved: bool, exc: Exception) -> _Again:
        """Redis failed for a purchase routed to it: the product may have been switched to
        ``database`` since this process learned its route (the rollback plan, made while Redis
        is down, leaves no marker in Redis), so MySQL is asked again and, if it says
        ``database``, the purchase goes there. Otherwise ``503 unavailable``.

        Raises:
            PurchaseRejected: ``unavailable``.
            ProductNotFound: MySQL has no such product.
        """
        if self._engine is not None and not moved:
            route = await self._routes.refresh(ask.product_id)
            if route.mode is StockMode.DATABASE:
                return _Again(StockMode.DATABASE, route)
        raise rejected(Down.STOCK) from exc

    async def _in_redis(self, ask: _Ask, flag_token: Token | None, moved: bool, retried: bool) -> Accepted | _Again:
        """Scheme 2: reserve in Redis, publish. ``moved``: MySQL already said the product is in
        ``redis`` mode (a second ``moved`` then means the switch is under way). ``retried``: this
        is the one retry after a ``rebucket`` answer or a rebalancing of the product's buckets.
        Returns the order, or where to try next (:meth:`purchase`'s loop)."""
        flags = self._sold_out
        product_id, quantity, request_id = ask.product_id, ask.quantity, ask.request_id
        try:
            candidate = await self._mint()
        except PurchaseRejected as exc:
            return await self._redis_failed(ask, moved, exc)
        # This HTTP attempt's token: a release names it, so it gives back only what this attempt
        # reserved (never the confirmed original of a retry, nor a concurrent attempt's).
        attempt = new_attempt()
        try:
            reservation = await self._store.reservations.reserve(
                product_id,
                request_id,
                ask.user_id,
                quantity,
                candidate,
                attempt,
                ask.order_token,
                ask.client,
                bucket=ask.bucket,
                buckets=ask.buckets,
            )
            others = None
            if reservation.outcome is ReserveOutcome.SOLD_OUT and ask.buckets > 1:
                others = await self._other_buckets(ask)
        except (StoreUnavailable, OSError) as exc:
            # The script may have run and only its reply been lost, or it may still be on the
            # wire: give back what this attempt holds, or mark it abandoned so it never takes effect.
            log.warning("reserve_failed", request_id=request_id, error=repr(exc))
            await self._give_back(ask, attempt)
            return await self._redis_failed(ask, moved, exc)
        if others is not None:
            if others >= quantity:
                # Units are left, in other buckets: rebalanced, the buyer's bucket gets what it asks.
                self._minter.give_back(candidate)
                if retried or self._rebalance is None:
                    raise rejected(Down.REBALANCING)
                await self._rebalance(product_id, (ask.bucket, quantity))
                return _Again(StockMode.REDIS)
            reservation = dataclasses.replace(reservation, stock=others)
        if flags is not None and flag_token is not None and reservation.outcome is ReserveOutcome.SOLD_OUT:
            flags.sold_out(
                product_id, flag_token, reservation.stock, reservation.per_user_limit, reservation.sale_left_ms
            )
        order_no = reservation.order_no
        if order_no != candidate and reservation.outcome is not ReserveOutcome.NOT_LOADED:
            # A definite answer that did not use the candidate. Not after 'not loaded': Redis
            # lost data, and a number is never reused around a loss (service/domain/order_numbers/minter.py).
            self._minter.give_back(candidate)
        accepted = Accepted(order_no, request_id, product_id, quantity)
        outcome = reservation.outcome
        if outcome is ReserveOutcome.REPLAY:
            return accepted
        if outcome is ReserveOutcome.REBUCKET and not retried:
            # This process had not met the product's bucket count (K is fixed at creation).
            self._routes.forget(product_id)
            return _Again(StockMode.REDIS, ask=dataclasses.replace(ask, buckets=reservation.buckets))
        if outcome is ReserveOutcome.OVER_LIMIT:
            raise InvalidInput("quantity", _OVER_LIMIT)
        if outcome is ReserveOutcome.RATE_LIMITED:
            wait = -(-reservation.retry_after_ms // 1000)  # whole seconds, rounded up (RFC 9110 Retry-After)
            raise rejected(outcome, retry_after=wait)
        if outcome is ReserveOutcome.MOVED or (outcome is ReserveOutcome.NOT_LOADED and self._engine is not None):
            # Off the hot path: the product sells from MySQL, or Redis does not know it.
            route = await self._routes.refresh(product_id)
            if route.mode is StockMode.DATABASE and not moved:
                return _Again(StockMode.DATABASE, route)
            if outcome is ReserveOutcome.NOT_LOADED and self._not_loaded is not None:
                self._not_loaded(product_id)  # MySQL sells it through Redis: Redis lost its state
        if outcome is not ReserveOutcome.RESERVED:
            raise rejected(outcome)

        message = OrderMessage(
            request_id,
            order_no,
            ask.user_id,
            product_id,
            quantity,
            reservation.reserved_at_ms,
            reservation.unit_price * quantity,
            ask.bucket,
        )
        if self._background is not None:
            # The journal entry is the outbox: marked queued first, a retry is answered as a replay.
            await self._mark_queued(message)
            self._background.submit(message)
            return accepted
        try:
            await self._publisher.publish(message)
        except PublishFailed as exc:
            if await self._give_back(ask, attempt) is not ReleaseOutcome.CLAIMED:
                raise rejected(Down.QUEUE) from exc
            # A consumer already holds the message: the confirm was lost, the order was not.
        await self._mark_queued(message)
        return accepted

    async def _in_database(self, ask: _Ask, route: Route, moved: bool) -> Accepted | _Again:
        """Scheme 1: one MySQL transaction (:func:`buy_in_database`). An order token is taken
        from Redis atomically just before the transaction and put back when the transaction
        does not write the order (the compensation). ``moved``: Redis already said the product
        sells from MySQL. Returns the order, or where to try next (:meth:`purchase`'s loop)."""
        assert self._engine is not None  # a database route is only ever learned from MySQL
        user_id, product_id, request_id, order_token = ask.user_id, ask.product_id, ask.request_id, ask.order_token
        purchase = DatabasePurchase(user_id, product_id, ask.quantity, request_id, "")
        token_left: int | None = None
        if route.require_token:
            if order_token is None:
                if (await self._routes.refresh(product_id)).require_token:
                    raise rejected(ReserveOutcome.TOKEN_REQUIRED)
            else:
                token_left = await self._take_token(product_id, order_token, user_id, ask.bucket)
                if token_left in (TOKEN_USED, TOKEN_INVALID):
                    # Used by this user: by this very request id's first submission (that
                    # purchase is answered again) or by one still in progress.
                    replay = replay_of(await self._earlier(request_id), purchase)
                    if replay is not None:
                        return self._answered(replay, purchase)
                    refusal = ReserveOutcome.IN_FLIGHT if token_left == TOKEN_USED else ReserveOutcome.TOKEN_INVALID
                    raise rejected(refusal)
        try:
            candidate = await self._mint_for_database()
        except PurchaseRejected:
            if token_left is not None:
                await self._give_token(product_id, order_token or "", user_id, token_left, ask.bucket)
            raise
        purchase = DatabasePurchase(user_id, product_id, ask.quantity, request_id, candidate, token_left is not None)
        answer: DatabaseAnswer | None = None
        try:
            answer = await buy_in_database(self._engine, purchase)
        except (StoreFailure, OSError) as exc:
            log.warning("database_purchase_failed", request_id=request_id, error=repr(exc))
            answer = None
        finally:
            kept = answer is not None and answer.outcome in (ReserveOutcome.RESERVED, ReserveOutcome.REPLAY)
            if token_left is not None and not kept:
                await self._give_token(product_id, order_token or "", user_id, token_left, ask.bucket)
        if answer is None:  # the outcome is unknown (the commit may have happened): the number is not reused
            raise rejected(Down.DATABASE)
        if answer.outcome is not ReserveOutcome.RESERVED:
            self._database_minter.give_back(candidate)
        if answer.outcome is ReserveOutcome.MOVED:
            self._routes.forget(product_id)
            if not moved:
                return _Again(StockMode.REDIS)
        if answer.outcome is ReserveOutcome.TOKEN_REQUIRED and not route.require_token:
            # The kept route predates require_token: with a token in hand, take it this time.
            fresh = await self._routes.refresh(product_id)
            if order_token is not None and fresh.require_token:
                return _Again(StockMode.DATABASE, fresh)
        if answer.outcome is ReserveOutcome.NOT_LOADED:
            self._routes.forget(product_id)
            raise ProductNotFound(product_id)
        return self._answered(answer, purchase)

    @staticmethod
    def _answered(answer: DatabaseAnswer, purchase: DatabasePurchase) -> Accepted:
        """The accepted order of a ``database``-mode answer, or the rejection it raises."""
        if answer.outcome in (ReserveOutcome.RESERVED, ReserveOutcome.REPLAY):
            return Accepted(answer.order_no, purchase.request_id, purchase.product_id, purchase.quantity, answer.status)
        if answer.outcome is ReserveOutcome.OVER_LIMIT:
            raise InvalidInput("quantity", _OVER_LIMIT)
        raise rejected(answer.outcome)

    async def _earlier(self, request_id: str) -> tuple[str, int, int, int] | None:
        assert self._engine is not None
        try:
            return await earlier_order(self._engine, request_id)
        except (StoreFailure, OSError) as exc:
            raise rejected(Down.DATABASE) from exc

    async def _take_token(self, product_id: int, order_token: str, user_id: str, bucket: int) -> int:
        try:
            return await self._store.tokens.take(product_id, order_token, user_id, bucket=bucket)
        except (StoreUnavailable, OSError) as exc:
            raise rejected(Down.TOKENS) from exc

    async def _give_token(self, product_id: int, order_token: str, user_id: str, left_ms: int, bucket: int) -> None:
        try:
            await self._store.tokens.give_back(product_id, order_token, user_id, left_ms, bucket=bucket)
        except (StoreUnavailable, OSError) as exc:
            # The buyer asks for a new token; nothing was bought with this one.
            log.warning("give_token_failed", product_id=product_id, error=repr(exc))

    async def _mark_queued(self, message: OrderMessage) -> None:
        """Replay record -> ``queued`` and the order's Redis view; a Redis failure is logged only."""
        try:
            await self._store.reservations.mark_queued(
                message.product_id,
                message.request_id,
                message.order_no,
                message.user_id,
                message.quantity,
                bucket=message.bucket,
            )
        except (StoreUnavailable, OSError) as exc:
            # The order is queued all the same; a replay answers 409 until realignment resolves
            # its journal entry, then it is answered as a replay (reserve.lua).
            log.warning("mark_queued_failed", request_id=message.request_id, error=repr(exc))

    async def _other_buckets(self, ask: _Ask) -> int:
        """The buyer's bucket of a product of several answered ``sold_out``, but the product is
        sold out only when every bucket is: the units its buckets hold in all, or
        ``ask.quantity`` (as if enough were left) while a rebalancing pass is filling them.

        Raises:
            service.failures.StoreUnavailable: Redis failed.
        """
        states = await self._store.buckets.states(ask.product_id, ask.buckets)
        if any(filling for _, filling in states):
            return ask.quantity
        return sum(stock or 0 for stock, _ in states)

    async def _give_back(self, ask: _Ask, attempt: str) -> ReleaseOutcome | None:
        """Release the reservation ``attempt`` made for the request; None when Redis failed."""
        product_id, request_id = ask.product_id, ask.request_id
        try:
            return await self._store.reservations.release(product_id, request_id, attempt, bucket=ask.bucket)
        except (StoreUnavailable, OSError) as exc:
            # Whatever this attempt reserved stays in the journal; realignment re-publishes it after
            # the grace period (so an attempt answered 503 can still become an order here: the one
            # case the abandoned mark cannot cover, since it could not be written).
            log.error("release_failed", request_id=request_id, error=repr(exc))
            return None
