"""A purchase in stock mode ``database`` (docs/ARCHITECTURE.md, "Stock modes"): the order token
taken from Redis when the product needs one, an order number, then one MySQL transaction
(:func:`service.domain.purchase.database_transaction.buy_in_database`); the token is put back
when the transaction does not write the order (the compensation)."""

from __future__ import annotations

import structlog
from sqlalchemy.ext.asyncio import AsyncEngine

from db.models import StockMode
from service.adapters.redis.order_tokens import TOKEN_INVALID, TOKEN_USED, OrderTokens
from service.domain.errors import InvalidInput, ProductNotFound
from service.domain.order_numbers.minter import OrderNumberMinter
from service.domain.order_numbers.mysql_minter import MysqlOrderNumberMinter
from service.domain.purchase.answers import OVER_LIMIT, Accepted, Down, PurchaseRejected, rejected
from service.domain.purchase.buying import Purchase, TryNext, candidate_order_no
from service.domain.purchase.database_transaction import (
    DatabaseAnswer,
    DatabasePurchase,
    buy_in_database,
    earlier_order,
    replay_of,
)
from service.domain.purchase.product_modes import ProductMode, ProductModes
from service.failures import StoreFailure
from service.model.stock import ReserveOutcome

log = structlog.get_logger(__name__)
_KEPT = (ReserveOutcome.RESERVED, ReserveOutcome.REPLAY)


class DatabaseMode:
    """Purchases of products in stock mode ``database``, for one process. ``minter``: the
    order numbers of this mode (from MySQL; the Redis minter when none is given); ``tokens``:
    the order tokens in Redis; ``modes``: the process's known stock modes (corrected here when
    MySQL says the product moved)."""

    def __init__(
        self,
        engine: AsyncEngine,
        modes: ProductModes,
        minter: OrderNumberMinter | MysqlOrderNumberMinter,
        tokens: OrderTokens,
    ) -> None:
        self._engine = engine
        self._modes = modes
        self._minter = minter
        self._tokens = tokens

    async def buy(self, purchase: Purchase, known: ProductMode, moved: bool) -> Accepted | TryNext:
        """Take the order token, then one MySQL transaction (the module docstring). ``known``:
        what MySQL said of the product; ``moved``: Redis already said the product sells from
        MySQL. Returns the order, or where to try next.

        Raises:
            PurchaseRejected: a rejection, or ``unavailable``.
            InvalidInput: ``quantity`` above the product's per-user limit.
            ProductNotFound: MySQL has no such product.
        """
        token_left = await self._take_token(purchase, known)
        if isinstance(token_left, Accepted):
            return token_left
        try:
            candidate = await candidate_order_no(self._minter, Down.DATABASE)
        except PurchaseRejected:
            await self._give_token(purchase, token_left)
            raise
        written = DatabasePurchase(
            purchase.user_id,
            purchase.product_id,
            purchase.quantity,
            purchase.request_id,
            candidate,
            token_left is not None,
        )
        answer: DatabaseAnswer | None = None
        try:
            answer = await buy_in_database(self._engine, written)
        except StoreFailure as exc:
            log.warning("database_purchase_failed", request_id=purchase.request_id, error=repr(exc))
        finally:
            if answer is None or answer.outcome not in _KEPT:
                await self._give_token(purchase, token_left)
        if answer is None:  # the outcome is unknown (the commit may have happened): the number is not reused
            raise rejected(Down.DATABASE)
        if answer.outcome is not ReserveOutcome.RESERVED:
            self._minter.give_back(candidate)
        return await self._check(answer, written, purchase, known, moved)

    async def _take_token(self, purchase: Purchase, known: ProductMode) -> int | Accepted | None:
        """The order token's remaining lifetime (ms) once taken from Redis, None when the
        product needs none, or the earlier order when this very request already used it.

        Raises:
            PurchaseRejected: ``token_required``, ``request_in_progress`` or ``token_invalid``.
        """
        if not known.require_token:
            return None
        if purchase.order_token is None:
            if (await self._modes.refresh(purchase.product_id)).require_token:
                raise rejected(ReserveOutcome.TOKEN_REQUIRED)
            return None
        try:
            left = await self._tokens.take(
                purchase.product_id, purchase.order_token, purchase.user_id, bucket=purchase.bucket
            )
        except StoreFailure as exc:
            raise rejected(Down.TOKENS) from exc
        if left not in (TOKEN_USED, TOKEN_INVALID):
            return left
        # Used by this user: by this very request id's first submission (that purchase is
        # answered again) or by one still in progress.
        written = DatabasePurchase(purchase.user_id, purchase.product_id, purchase.quantity, purchase.request_id, "")
        replay = replay_of(await self._earlier(purchase.request_id), written)
        if replay is not None:
            return self._answered(replay, written)
        raise rejected(ReserveOutcome.IN_FLIGHT if left == TOKEN_USED else ReserveOutcome.TOKEN_INVALID)

    async def _check(
        self, answer: DatabaseAnswer, written: DatabasePurchase, purchase: Purchase, known: ProductMode, moved: bool
    ) -> Accepted | TryNext:
        """What the transaction's answer decides: the order, where to try next, or a rejection."""
        if answer.outcome is ReserveOutcome.MOVED:
            self._modes.forget(purchase.product_id)
            if not moved:
                return TryNext(StockMode.REDIS)
        if answer.outcome is ReserveOutcome.TOKEN_REQUIRED and not known.require_token:
            # The kept mode predates require_token: with a token in hand, take it this time.
            fresh = await self._modes.refresh(purchase.product_id)
            if purchase.order_token is not None and fresh.require_token:
                return TryNext(StockMode.DATABASE, fresh)
        if answer.outcome is ReserveOutcome.NOT_LOADED:
            self._modes.forget(purchase.product_id)
            raise ProductNotFound(purchase.product_id)
        return self._answered(answer, written)

    @staticmethod
    def _answered(answer: DatabaseAnswer, purchase: DatabasePurchase) -> Accepted:
        """The accepted order of a ``database``-mode answer, or the rejection it raises."""
        if answer.outcome in _KEPT:
            return Accepted(answer.order_no, purchase.request_id, purchase.product_id, purchase.quantity, answer.status)
        if answer.outcome is ReserveOutcome.OVER_LIMIT:
            raise InvalidInput("quantity", OVER_LIMIT)
        raise rejected(answer.outcome)

    async def _earlier(self, request_id: str) -> tuple[str, int, int, int] | None:
        try:
            return await earlier_order(self._engine, request_id)
        except StoreFailure as exc:
            raise rejected(Down.DATABASE) from exc

    async def _give_token(self, purchase: Purchase, left_ms: int | None) -> None:
        """Put the order token back (``left_ms`` of its lifetime); nothing when none was taken."""
        if left_ms is None:
            return
        try:
            await self._tokens.give_back(
                purchase.product_id, purchase.order_token or "", purchase.user_id, left_ms, bucket=purchase.bucket
            )
        except StoreFailure as exc:
            # The buyer asks for a new token; nothing was bought with this one.
            log.warning("give_token_failed", product_id=purchase.product_id, error=repr(exc))
