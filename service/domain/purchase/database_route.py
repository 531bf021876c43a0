"""The ``database`` stock-mode route of a purchase: an order token taken from Redis when the
product needs one, an order number, then one MySQL transaction
(:func:`service.domain.purchase.database.buy_in_database`); docs/ARCHITECTURE.md, "Stock modes"."""

from __future__ import annotations

import structlog
from sqlalchemy.ext.asyncio import AsyncEngine

from db.models import StockMode
from service.adapters.redis.order_tokens import TOKEN_INVALID, TOKEN_USED, OrderTokens
from service.domain.errors import InvalidInput, ProductNotFound
from service.domain.model.stock import ReserveOutcome
from service.domain.order_numbers.minter import OrderNumberMinter, ShardLost
from service.domain.order_numbers.mysql_minter import MysqlOrderNumberMinter
from service.domain.purchase.answers import OVER_LIMIT, Accepted, Down, PurchaseRejected, rejected
from service.domain.purchase.ask import Again, Ask
from service.domain.purchase.database import (
    DatabaseAnswer,
    DatabasePurchase,
    buy_in_database,
    earlier_order,
    replay_of,
)
from service.domain.purchase.routes import Route, RouteCache
from service.failures import StoreFailure

log = structlog.get_logger(__name__)


class DatabaseRoute:
    """Purchases of products in stock mode ``database``, for one process. ``minter``: the
    order numbers of this mode (from MySQL; the Redis minter when none is given); ``tokens``:
    the order tokens in Redis; ``routes``: the process's stock-mode routes (corrected here when
    MySQL says the product moved)."""

    def __init__(
        self,
        engine: AsyncEngine,
        routes: RouteCache,
        minter: OrderNumberMinter | MysqlOrderNumberMinter,
        tokens: OrderTokens,
    ) -> None:
        self._engine = engine
        self._routes = routes
        self._minter = minter
        self._tokens = tokens

    async def buy(self, ask: Ask, route: Route, moved: bool) -> Accepted | Again:
        """One MySQL transaction (:func:`buy_in_database`). An order token is taken
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
            candidate = await self._mint()
        except PurchaseRejected:
            if token_left is not None:
                await self._give_token(product_id, order_token or "", user_id, token_left, ask.bucket)
            raise
        purchase = DatabasePurchase(user_id, product_id, ask.quantity, request_id, candidate, token_left is not None)
        answer: DatabaseAnswer | None = None
        try:
            answer = await buy_in_database(self._engine, purchase)
        except StoreFailure as exc:
            log.warning("database_purchase_failed", request_id=request_id, error=repr(exc))
            answer = None
        finally:
            kept = answer is not None and answer.outcome in (ReserveOutcome.RESERVED, ReserveOutcome.REPLAY)
            if token_left is not None and not kept:
                await self._give_token(product_id, order_token or "", user_id, token_left, ask.bucket)
        if answer is None:  # the outcome is unknown (the commit may have happened): the number is not reused
            raise rejected(Down.DATABASE)
        if answer.outcome is not ReserveOutcome.RESERVED:
            self._minter.give_back(candidate)
        if answer.outcome is ReserveOutcome.MOVED:
            self._routes.forget(product_id)
            if not moved:
                return Again(StockMode.REDIS)
        if answer.outcome is ReserveOutcome.TOKEN_REQUIRED and not route.require_token:
            # The kept route predates require_token: with a token in hand, take it this time.
            fresh = await self._routes.refresh(product_id)
            if order_token is not None and fresh.require_token:
                return Again(StockMode.DATABASE, fresh)
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
            raise InvalidInput("quantity", OVER_LIMIT)
        raise rejected(answer.outcome)

    async def _earlier(self, request_id: str) -> tuple[str, int, int, int] | None:
        assert self._engine is not None
        try:
            return await earlier_order(self._engine, request_id)
        except StoreFailure as exc:
            raise rejected(Down.DATABASE) from exc

    async def _take_token(self, product_id: int, order_token: str, user_id: str, bucket: int) -> int:
        try:
            return await self._tokens.take(product_id, order_token, user_id, bucket=bucket)
        except StoreFailure as exc:
            raise rejected(Down.TOKENS) from exc

    async def _give_token(self, product_id: int, order_token: str, user_id: str, left_ms: int, bucket: int) -> None:
        try:
            await self._tokens.give_back(product_id, order_token, user_id, left_ms, bucket=bucket)
        except StoreFailure as exc:
            # The buyer asks for a new token; nothing was bought with this one.
            log.warning("give_token_failed", product_id=product_id, error=repr(exc))

    async def _mint(self) -> str:
        try:
            return await self._minter.take()
        except (StoreFailure, ShardLost) as exc:
            log.warning("order_no_unavailable", error=repr(exc))
            raise rejected(Down.DATABASE) from exc
