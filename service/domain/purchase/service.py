"""The purchase path, per product stock mode (docs/ARCHITECTURE.md, "Purchase path"):

- ``redis``: reserve in Redis (one Lua call), publish with confirm, or give it back
  (publish mode ``confirm``); or reserve, mark queued and publish in the background (``async``)
  (:class:`~service.domain.purchase.redis_mode.RedisMode`).
- ``database``: one MySQL transaction (:class:`~service.domain.purchase.database_mode.DatabaseMode`).

:meth:`PurchaseService.purchase` is an explicit loop over at most two stock modes, each tried at
most twice; every rejection comes from one table (:mod:`service.domain.purchase.answers`).

``PurchaseService.purchase`` is the whole hot path; the HTTP controller decodes the request,
works out its request id, and maps the outcome to a status code.

Which mode a product is in is kept per process
(:class:`~service.domain.purchase.product_modes.ProductModes`), learned from MySQL
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

import secrets
from collections.abc import Awaitable, Callable

from sqlalchemy.ext.asyncio import AsyncEngine

from db.models import StockMode
from service.adapters.background_publisher import BackgroundPublisher
from service.adapters.broker import Publisher
from service.adapters.redis.stores import RedisStores
from service.domain.errors import DomainError
from service.domain.order_numbers.minter import OrderNumberMinter
from service.domain.order_numbers.mysql_minter import MysqlOrderNumberMinter
from service.domain.purchase.answers import Accepted, Down, flag_answer, rejected
from service.domain.purchase.buying import Purchase, TryNext
from service.domain.purchase.database_mode import DatabaseMode
from service.domain.purchase.product_modes import ProductModes
from service.domain.purchase.redis_mode import RedisMode
from service.domain.purchase.sold_out import SoldOutFlags
from service.domain.stock.buckets import bucket_of
from service.failures import StoreFailure

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
        self._sold_out = sold_out
        self._modes = ProductModes(engine)
        self._redis = RedisMode(store, minter, publisher, self._modes, background, sold_out, not_loaded, rebalance)
        self._database = (
            None if engine is None else DatabaseMode(engine, self._modes, database_minter or minter, store.tokens)
        )
        self.token_ttl_seconds = token_ttl_seconds

    def standing_rejection(self, product_id: int, quantity: int) -> DomainError | None:
        """The sold-out shortcut: what a standing sold-out flag answers for a request without an
        Idempotency-Key (:mod:`service.domain.purchase.sold_out`), or None (ask Redis: call
        :meth:`purchase`). Returned, not raised: the HTTP edge answers the most frequent outcome
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
        order_token: str | None = None,
        client: str = "",
        admission: str | None = None,
    ) -> Accepted:
        """Buy ``quantity`` units of ``product_id`` for ``user_id`` in the product's stock mode.

        ``redis``: reserve and queue the order; returns it once the broker confirmed it (or in
        publish mode ``async`` once it is reserved and marked queued). ``database``: write it in
        one MySQL transaction; returns it ``pending_payment`` (``status`` set). Either way the
        earlier answer for a replayed request id. A request without an Idempotency-Key asks
        :meth:`standing_rejection` first. ``order_token``: the ``Order-Token`` header (the
        request id derives from it); consumed by the purchase it makes. ``client`` is the
        caller's address, for the per-address purchase rate (checked in the reserve call; stock
        mode ``redis`` only). ``admission``: the ``Admission-Token`` the product's waiting room
        gave ``user_id``, checked and consumed in the reserve call (docs/ARCHITECTURE.md,
        "Waiting room").

        Raises:
            PurchaseRejected: a business rejection (nothing was written) or ``unavailable``
                (Redis/RabbitMQ/MySQL failure; any reservation made was given back).
            InvalidInput: ``quantity`` above the product's per-user limit.
            ProductNotFound: neither Redis nor MySQL knows the product.
        """
        flag = None if self._sold_out is None else self._sold_out.token(product_id)
        known = self._modes.cached(product_id) or await self._modes.load(product_id)
        purchase = Purchase(user_id, product_id, quantity, request_id, order_token, client, known.buckets, admission)
        # At most two stock modes (one move: both sides saying "the other one" means a switch is
        # under way), each tried at most twice (a rebucket, a rebalancing or a token requirement
        # learned).
        step = TryNext(known.stock_mode, known)
        moved = retried = False
        for _ in range(4):
            if step.stock_mode is StockMode.DATABASE:
                assert step.product_mode is not None and self._database is not None  # learned from MySQL
                result = await self._database.buy(purchase, step.product_mode, moved)
            else:
                result = await self._redis.buy(purchase, flag, moved, retried)
            if isinstance(result, Accepted):
                return result
            if result.stock_mode is step.stock_mode:
                retried = True
            else:
                moved, retried, flag = True, False, None
            purchase, step = result.purchase or purchase, result
        raise AssertionError("a purchase took more than two stock modes, twice each")

    async def issue_token(self, user_id: str, product_id: int) -> str:
        """A new order token for ``user_id`` and ``product_id`` (32 URL-safe characters), kept in
        the product's Redis slot for ``token_ttl_seconds`` (the anti-duplicate token issued when
        the order page opens).

        Raises:
            ProductNotFound: MySQL has no such product.
            PurchaseRejected: ``unavailable`` (Redis failed).
        """
        known = await self._modes.mode(product_id)
        token = secrets.token_urlsafe(ORDER_TOKEN_BYTES)
        bucket = bucket_of(user_id, known.buckets)
        try:
            await self._store.tokens.issue(product_id, token, user_id, self.token_ttl_seconds, bucket=bucket)
        except StoreFailure as exc:
            raise rejected(Down.STOCK) from exc
        return token
