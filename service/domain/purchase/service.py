"""The purchase path, per product stock mode (docs/ARCHITECTURE.md, "Purchase path"):

- ``redis``: reserve in Redis (one Lua call), publish with confirm, or give it back
  (publish mode ``confirm``); or reserve, mark queued and publish in the background (``async``).
- ``database``: one MySQL transaction (:class:`~service.domain.purchase.database_route.DatabaseRoute`).

:meth:`PurchaseService.purchase` is an explicit loop over at most two routes, each tried at most
twice; every rejection comes from one table (:mod:`service.domain.purchase.answers`).

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

import structlog
from sqlalchemy.ext.asyncio import AsyncEngine

from db.models import StockMode
from service.adapters.background_publisher import BackgroundPublisher
from service.adapters.broker import Publisher
from service.adapters.redis.reservations import new_attempt
from service.adapters.redis.stores import RedisStores
from service.domain.errors import DomainError, InvalidInput
from service.domain.model.order_message import OrderMessage
from service.domain.model.stock import ReleaseOutcome, ReserveOutcome
from service.domain.order_numbers.minter import OrderNumberMinter, ShardLost
from service.domain.order_numbers.mysql_minter import MysqlOrderNumberMinter
from service.domain.purchase.answers import OVER_LIMIT, Accepted, Down, PurchaseRejected, flag_answer, rejected
from service.domain.purchase.ask import Again, Ask
from service.domain.purchase.database_route import DatabaseRoute
from service.domain.purchase.routes import RouteCache
from service.domain.purchase.sold_out import SoldOutFlags, Token
from service.domain.stock.buckets import bucket_of
from service.failures import PublishFailed, StoreFailure

log = structlog.get_logger(__name__)

ORDER_TOKEN_BYTES = 24
"""Random bytes of an order token: 192 bits, 32 URL-safe characters."""


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
        self._publisher = publisher
        self._background = background
        self._sold_out = sold_out
        self._routes = RouteCache(engine)
        self._database = (
            None if engine is None else DatabaseRoute(engine, self._routes, database_minter or minter, store.tokens)
        )
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
        return flag_answer(verdict)

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
        admission: str | None = None,
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
        ``admission``: the ``Admission-Token`` the product's waiting room gave ``user_id``, checked
        and consumed in the reserve call (docs/ARCHITECTURE.md, "Waiting room").

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
        ask = Ask(user_id, product_id, quantity, request_id, order_token, client, route.buckets, admission)
        # At most two routes (one move: both sides saying "the other one" means a switch is under
        # way), each tried at most twice (a rebucket, a rebalancing or a token requirement learned).
        step = Again(route.mode, route)
        moved = retried = False
        for _ in range(4):
            if step.mode is StockMode.DATABASE:
                assert step.route is not None and self._database is not None  # learned from MySQL
                result = await self._database.buy(ask, step.route, moved)
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
        except StoreFailure as exc:
            raise rejected(Down.STOCK) from exc
        return token

    async def _mint(self) -> str:
        try:
            return await self._minter.take()
        except (StoreFailure, ShardLost) as exc:
            log.warning("order_no_unavailable", error=repr(exc))
            raise rejected(Down.STOCK) from exc

    async def _redis_failed(self, ask: Ask, moved: bool, exc: Exception) -> Again:
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
                return Again(StockMode.DATABASE, route)
        raise rejected(Down.STOCK) from exc

    async def _in_redis(self, ask: Ask, flag_token: Token | None, moved: bool, retried: bool) -> Accepted | Again:
        """Stock mode ``redis``: reserve in Redis, publish. ``moved``: MySQL already said the product is in
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
                admission=ask.admission,
            )
            others = None
            if reservation.outcome is ReserveOutcome.SOLD_OUT and ask.buckets > 1:
                others = await self._other_buckets(ask)
        except StoreFailure as exc:
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
                return Again(StockMode.REDIS)
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
            return Again(StockMode.REDIS, ask=dataclasses.replace(ask, buckets=reservation.buckets))
        if outcome is ReserveOutcome.OVER_LIMIT:
            raise InvalidInput("quantity", OVER_LIMIT)
        if outcome is ReserveOutcome.RATE_LIMITED:
            wait = -(-reservation.retry_after_ms // 1000)  # whole seconds, rounded up (RFC 9110 Retry-After)
            raise rejected(outcome, retry_after=wait)
        if outcome is ReserveOutcome.MOVED or (outcome is ReserveOutcome.NOT_LOADED and self._engine is not None):
            # Off the hot path: the product sells from MySQL, or Redis does not know it.
            route = await self._routes.refresh(product_id)
            if route.mode is StockMode.DATABASE and not moved:
                return Again(StockMode.DATABASE, route)
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
            attempt,
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
        except StoreFailure as exc:
            # The order is queued all the same; a replay answers 409 until realignment resolves
            # its journal entry, then it is answered as a replay (reserve.lua).
            log.warning("mark_queued_failed", request_id=message.request_id, error=repr(exc))

    async def _other_buckets(self, ask: Ask) -> int:
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

    async def _give_back(self, ask: Ask, attempt: str) -> ReleaseOutcome | None:
        """Release the reservation ``attempt`` made for the request; None when Redis failed."""
        product_id, request_id = ask.product_id, ask.request_id
        try:
            return await self._store.reservations.release(product_id, request_id, attempt, bucket=ask.bucket)
        except StoreFailure as exc:
            # Whatever this attempt reserved stays in the journal; realignment re-publishes it after
            # the grace period (so an attempt answered 503 can still become an order here: the one
            # case the abandoned mark cannot cover, since it could not be written).
            log.error("release_failed", request_id=request_id, error=repr(exc))
            return None
